//! `joist sim serve`: kubesim (the embedded Kubernetes API server and cluster) on 127.0.0.1, with
//! Joist's CRDs installed and a kubeconfig written for kubectl and helm. Runs until Ctrl-C.

use std::{io, path::Path, process::ExitCode};

use joist_kubesim::{Cluster, ClusterSettings};

use super::CommandError;

/// Serves kubesim until interrupted.
pub fn serve(
    kubeconfig: Option<&Path>,
    port: u16,
    out: &mut dyn io::Write,
) -> Result<ExitCode, CommandError> {
    let runtime = super::runtime()?;
    runtime.block_on(async {
        let cluster = Cluster::start(ClusterSettings::default());
        install_crds(&cluster)?;
        let server = cluster
            .serve_http(port)
            .await
            .map_err(|source| CommandError::Serve { port, source })?;
        let path = kubeconfig.map(Path::to_path_buf).unwrap_or_else(|| {
            std::env::temp_dir().join(format!("kubesim-{}.kubeconfig", server.address().port()))
        });
        server
            .write_kubeconfig(&path)
            .map_err(|source| CommandError::Write {
                path: path.clone(),
                source,
            })?;
        writeln!(
            out,
            "kubesim is serving Kubernetes v1.35 on {url} (no nodes yet; Joist's CRDs installed).\n\
             kubeconfig: {path}\n\n  export KUBECONFIG={path}\n  kubectl apply -f deployment.yaml\n  \
             kubectl get pods -w\n\nCtrl-C stops it.",
            url = server.url(),
            path = path.display()
        )
        .and_then(|()| out.flush())
        .map_err(CommandError::stdout)?;
        tokio::signal::ctrl_c()
            .await
            .map_err(|source| CommandError::Runtime { source })?;
        Ok(ExitCode::SUCCESS)
    })
}

/// Creates the NodePool, NodeClaim and EC2NodeClass CRDs, so their manifests apply unchanged.
pub fn install_crds(cluster: &Cluster) -> Result<(), CommandError> {
    cluster
        .install_crds(joist_messages::apis::crds().into_iter().map(|(_, crd)| crd))
        .map_err(|e| CommandError::Install {
            message: e.to_string(),
        })
}
