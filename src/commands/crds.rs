//! `joist crds`: the generated CustomResourceDefinitions as YAML.

use std::{io, path::Path};

use joist_messages::apis::crds;

use super::CommandError;

/// Renders every CRD; each document starts with `---`.
pub fn render() -> Result<Vec<(&'static str, String)>, CommandError> {
    crds()
        .into_iter()
        .map(|(file, crd)| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            serde_saphyr::to_string(&crd)
                .map(|yaml| (file, format!("---\n{yaml}")))
                .map_err(|e| CommandError::Render {
                    name,
                    message: e.to_string(),
                })
        })
        .collect()
}

pub(super) fn run(out_dir: Option<&Path>, out: &mut dyn io::Write) -> Result<(), CommandError> {
    for (file, yaml) in render()? {
        match out_dir {
            Some(dir) => {
                let path = dir.join(file);
                std::fs::write(&path, yaml).map_err(|source| CommandError::Write { path, source })?;
            }
            None => out.write_all(yaml.as_bytes()).map_err(CommandError::stdout)?,
        }
    }
    Ok(())
}
