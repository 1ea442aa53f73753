//! Where a pod's volumes can be used, as Karpenter reads it before scheduling: each claim the
//! pod uses (by name, or made for it from an ephemeral volume's template, `<pod>-<volume>`)
//! limits the node to its bound PersistentVolume's node affinity or, while unbound, to its
//! StorageClass's allowed topologies. Several OR'ed terms give several alternatives; a pod of
//! several claims gets the combinations of their alternatives that do not conflict (all of them
//! when every one does, so the pod is reported unschedulable rather than dropped). Hostname terms
//! of local and hostPath volumes are left out: a new node is never the old host.
//!
//! A claim without a volume or a class gives no topology (the cluster's default class, if any,
//! was written into it at admission). Fails with [`PodError::Volume`], naming the pod, the
//! volume and what is missing, as Karpenter refuses such pods: a claim, volume or class that
//! does not exist, a claim being deleted or lost.

use std::sync::Arc;

use joist_messages::{
    cached_pod::{CachedPod, CachedVolume},
    labels::HOSTNAME,
    model::requirements::Requirements,
};
use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};

use crate::pod::{AttachedVolume, PodError, term_requirements, topology_requirements};

/// The cluster's storage objects, by name.
pub trait StorageObjects {
    /// A PersistentVolumeClaim.
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>>;
    /// A PersistentVolume.
    fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>>;
    /// A StorageClass.
    fn class(&self, name: &str) -> Option<Arc<StorageClass>>;
}

/// What a pod's volumes need of a node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodVolumes {
    /// Where they can be used: OR'ed alternatives (see the module docs); empty for anywhere.
    pub requirements: Vec<Requirements>,
    /// The volumes it attaches whose CSI driver is known (from the bound volume, or the class
    /// that will provision it; an in-tree plugin counts as the CSI driver it migrated to), for
    /// the drivers' attach limits.
    pub attached: Vec<AttachedVolume>,
}

/// Whether any of `pod`'s volumes is a claim (its own, or one made from an ephemeral volume's
/// template): only then does [`pod_volumes`] depend on more than the pod.
pub fn uses_claims(pod: &CachedPod) -> bool {
    let mut volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    volumes.any(|volume| volume.persistent_volume_claim.is_some() || volume.ephemeral.is_some())
}

/// What `pod`'s volumes need of a node (see the module docs).
pub fn pod_volumes(pod: &CachedPod, objects: &impl StorageObjects) -> Result<PodVolumes, PodError> {
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    let mut out = PodVolumes::default();
    for (i, volume) in volumes.enumerate() {
        let Some(claim) = claim_of(pod, i, volume, objects)? else {
            continue;
        };
        if let Some(driver) = claim.driver {
            out.attached.push(AttachedVolume {
                driver,
                claim: claim.name,
            });
        }
        if claim.alternatives.is_empty() {
            continue;
        }
        out.requirements = if out.requirements.is_empty() {
            claim.alternatives
        } else {
            combine(&out.requirements, &claim.alternatives)
        };
    }
    Ok(out)
}

/// Every pair of alternatives merged, those that conflict left out unless all do.
fn combine(alternatives: &[Requirements], of_volume: &[Requirements]) -> Vec<Requirements> {
    let merged = |compatible_only: bool| -> Vec<Requirements> {
        alternatives
            .iter()
            .flat_map(|a| of_volume.iter().map(move |b| (a, b)))
            .filter(|(a, b)| !compatible_only || a.overlaps(b))
            .map(|(a, b)| {
                let mut both = a.clone();
                both.add_all(b);
                both
            })
            .collect()
    };
    let compatible = merged(true);
    if compatible.is_empty() {
        merged(false)
    } else {
        compatible
    }
}

/// One claim a pod uses, as its volume needs it.
struct ClaimUse {
    /// `namespace/name`.
    name: String,
    /// Where it can be used (none: anywhere).
    alternatives: Vec<Requirements>,
    /// The CSI driver that attaches it, when known.
    driver: Option<String>,
}

/// The claim one of the pod's volumes uses; `None` for a volume that claims nothing.
fn claim_of(
    pod: &CachedPod,
    index: usize,
    volume: &CachedVolume,
    objects: &impl StorageObjects,
) -> Result<Option<ClaimUse>, PodError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let pod_key = || format!("{namespace}/{pod_name}");
    let error = |field: &str, message: String| PodError::Volume {
        pod: pod_key(),
        field: format!("spec.volumes[{index}]{field}"),
        message,
    };
    let (claim_name, template_class) = match (&volume.persistent_volume_claim, &volume.ephemeral) {
        (Some(source), _) => (source.claim_name.clone(), None),
        (None, Some(ephemeral)) => {
            let class = ephemeral
                .volume_claim_template
                .as_ref()
                .and_then(|t| t.spec.storage_class_name.clone());
            (format!("{pod_name}-{}", volume.name), class)
        }
        (None, None) => return Ok(None),
    };
    let field = if volume.ephemeral.is_some() {
        ".ephemeral"
    } else {
        ".persistentVolumeClaim.claimName"
    };
    let mut found = ClaimUse {
        name: format!("{namespace}/{claim_name}"),
        alternatives: Vec::new(),
        driver: None,
    };
    let Some(claim) = objects.claim(namespace, &claim_name) else {
        // An ephemeral volume's claim is made once the pod exists: until it is, its template
        // says where it will be provisioned.
        return match template_class {
            Some(class) => {
                let (alternatives, driver) = class_use(&class, objects).map_err(|m| error(field, m))?;
                found.alternatives = alternatives;
                found.driver = driver;
                Ok(Some(found))
            }
            None if volume.ephemeral.is_some() => Ok(Some(found)),
            None => Err(error(
                field,
                format!("PersistentVolumeClaim {namespace}/{claim_name} not found"),
            )),
        };
    };
    let claim_ref = format!("PersistentVolumeClaim {namespace}/{claim_name}");
    if claim.metadata.deletion_timestamp.is_some() {
        return Err(error(field, format!("{claim_ref} is being deleted")));
    }
    let status = claim.status.as_ref().and_then(|s| s.phase.as_deref());
    if status == Some("Lost") {
        return Err(error(field, format!("{claim_ref} lost its PersistentVolume")));
    }
    let spec = claim.spec.as_ref();
    if let Some(bound) = spec
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty())
    {
        let Some(pv) = objects.volume(bound) else {
            return Err(error(
                field,
                format!("{claim_ref} is bound to PersistentVolume {bound}, which does not exist"),
            ));
        };
        found.alternatives = volume_alternatives(&pod_key(), bound, &pv)?;
        found.driver = pv
            .spec
            .as_ref()
            .and_then(|s| match (&s.csi, &s.aws_elastic_block_store) {
                (Some(csi), _) => Some(csi.driver.clone()),
                (None, Some(_)) => Some(EBS_CSI_DRIVER.to_owned()),
                (None, None) => None,
            });
        return Ok(Some(found));
    }
    if let Some(class) = spec
        .and_then(|s| s.storage_class_name.as_deref())
        .filter(|c| !c.is_empty())
    {
        let (alternatives, driver) =
            class_use(class, objects).map_err(|m| error(field, format!("{claim_ref}: {m}")))?;
        found.alternatives = alternatives;
        found.driver = driver;
    }
    Ok(Some(found))
}

/// A bound volume's node affinity terms, hostname left out of local and hostPath volumes.
fn volume_alternatives(pod: &str, name: &str, pv: &PersistentVolume) -> Result<Vec<Requirements>, PodError> {
    let Some(spec) = pv.spec.as_ref() else {
        return Ok(Vec::new());
    };
    let on_host = spec.local.is_some() || spec.host_path.is_some();
    let terms = spec
        .node_affinity
        .as_ref()
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    let mut alternatives = Vec::with_capacity(terms.len());
    for (i, term) in terms.iter().enumerate() {
        let field = format!("PersistentVolume {name} spec.nodeAffinity.required.nodeSelectorTerms[{i}]");
        let requirements = term_requirements(pod, &field, term)?;
        alternatives.push(if on_host {
            requirements
                .iter()
                .filter(|r| r.key() != HOSTNAME)
                .cloned()
                .collect()
        } else {
            requirements
        });
    }
    // A term that said nothing else allows any node, so the volume does.
    if alternatives.iter().any(Requirements::is_empty) {
        return Ok(Vec::new());
    }
    Ok(alternatives)
}

/// A StorageClass's allowed topologies and provisioner, or what is wrong with it.
fn class_use(
    name: &str,
    objects: &impl StorageObjects,
) -> Result<(Vec<Requirements>, Option<String>), String> {
    let class = objects
        .class(name)
        .ok_or_else(|| format!("StorageClass {name} not found"))?;
    let terms = class.allowed_topologies.as_deref().unwrap_or_default();
    let alternatives = terms
        .iter()
        .enumerate()
        .map(|(i, term)| {
            topology_requirements(term)
                .map_err(|m| format!("StorageClass {name} allowedTopologies[{i}]: {m}"))
        })
        .filter(|r| r.as_ref().is_err() || r.as_ref().is_ok_and(|r| !r.is_empty()))
        .collect::<Result<_, _>>()?;
    Ok((alternatives, Some(csi_driver(&class.provisioner).to_owned())))
}

/// The CSI driver of the EBS volumes, the in-tree `kubernetes.io/aws-ebs` plugin's too.
const EBS_CSI_DRIVER: &str = "ebs.csi.aws.com";

/// The CSI driver a provisioner's volumes attach with: in-tree plugins migrated to CSI are
/// counted against their CSI driver's limit, as the CSI translation library names them.
fn csi_driver(provisioner: &str) -> &str {
    match provisioner {
        "kubernetes.io/aws-ebs" => EBS_CSI_DRIVER,
        "kubernetes.io/gce-pd" => "pd.csi.storage.gke.io",
        "kubernetes.io/azure-disk" => "disk.csi.azure.com",
        "kubernetes.io/azure-file" => "file.csi.azure.com",
        "kubernetes.io/cinder" => "cinder.csi.openstack.org",
        "kubernetes.io/vsphere-volume" => "csi.vsphere.vmware.com",
        "kubernetes.io/portworx-volume" => "pxd.portworx.com",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use joist_messages::labels::ZONE;
    use serde_json::{Value, json};

    use super::*;

    #[derive(Default)]
    struct Objects {
        claims: HashMap<String, Arc<PersistentVolumeClaim>>,
        volumes: HashMap<String, Arc<PersistentVolume>>,
        classes: HashMap<String, Arc<StorageClass>>,
    }

    impl StorageObjects for Objects {
        fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
            self.claims.get(&format!("{namespace}/{name}")).cloned()
        }
        fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
            self.volumes.get(name).cloned()
        }
        fn class(&self, name: &str) -> Option<Arc<StorageClass>> {
            self.classes.get(name).cloned()
        }
    }

    fn parse<T: k8s_openapi::serde::de::DeserializeOwned>(value: Value) -> Arc<T> {
        Arc::new(serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}")))
    }

    impl Objects {
        fn claim(mut self, name: &str, spec: Value) -> Self {
            let claim = parse(json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec}));
            self.claims.insert(format!("default/{name}"), claim);
            self
        }
        fn volume(mut self, name: &str, spec: Value) -> Self {
            self.volumes.insert(
                name.to_owned(),
                parse(json!({"metadata": {"name": name}, "spec": spec})),
            );
            self
        }
        fn class(mut self, name: &str, zones: &[&[&str]]) -> Self {
            let terms: Vec<Value> = zones
                .iter()
                .map(|z| json!({"matchLabelExpressions": [{"key": ZONE, "values": z}]}))
                .collect();
            let class = json!({"metadata": {"name": name}, "provisioner": "kubernetes.io/aws-ebs", "allowedTopologies": terms});
            self.classes.insert(name.to_owned(), parse(class));
            self
        }
    }

    fn pod(volumes: Value) -> CachedPod {
        serde_json::from_value(json!({
            "metadata": {"name": "db-0", "namespace": "default"},
            "spec": {"containers": [], "volumes": volumes},
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn claims(names: &[&str]) -> Value {
        names
            .iter()
            .map(|n| json!({"name": n, "persistentVolumeClaim": {"claimName": n}}))
            .collect()
    }

    fn zone_affinity(key: &str, zone: &str) -> Value {
        json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": "In", "values": [zone]}]}]}})
    }

    /// Each alternative's zones.
    fn zones(found: &PodVolumes) -> Vec<Vec<String>> {
        found
            .requirements
            .iter()
            .map(|a| {
                a.get(ZONE)
                    .map(|r| r.values().map(str::to_owned).collect())
                    .unwrap_or_default()
            })
            .collect()
    }

    #[test]
    fn a_bound_claim_keeps_the_pod_in_its_volumes_zone_under_either_zone_key() {
        let objects = Objects::default()
            .claim("data", json!({"volumeName": "pv-1"}))
            .volume(
                "pv-1",
                json!({"nodeAffinity": zone_affinity("topology.ebs.csi.aws.com/zone", "b")}),
            );
        let found = pod_volumes(&pod(claims(&["data"])), &objects).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(zones(&found), [["b"]]);
    }

    #[test]
    fn an_unbound_claim_follows_its_class_and_two_claims_keep_the_alternatives_both_allow() {
        let objects = Objects::default()
            .claim("data", json!({"storageClassName": "two-terms"}))
            .class("two-terms", &[&["a"], &["b", "c"]])
            .claim("logs", json!({"volumeName": "pv-logs"}))
            .volume("pv-logs", json!({"nodeAffinity": zone_affinity(ZONE, "c")}))
            .claim("tmp", json!({"volumeName": "pv-tmp"}))
            .volume(
                "pv-tmp",
                json!({"csi": {"driver": "efs.csi.aws.com", "volumeHandle": "fs-1"}}),
            )
            .claim("old", json!({"volumeName": "pv-old"}))
            .volume("pv-old", json!({"awsElasticBlockStore": {"volumeID": "vol-old"}}));
        let one = pod_volumes(&pod(claims(&["data"])), &objects).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(zones(&one), [vec!["a"], vec!["b", "c"]]);
        let both = pod_volumes(&pod(claims(&["data", "logs"])), &objects).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            zones(&both),
            [["c"]],
            "zone a conflicts with the bound volume's c"
        );
        // The class's provisioner attaches the unbound one (the in-tree EBS plugin counts as the
        // EBS CSI driver), the volume's CSI driver a bound one; a volume of no driver (pv-logs)
        // is not counted.
        let all = pod_volumes(&pod(claims(&["data", "logs", "tmp", "old"])), &objects)
            .unwrap_or_else(|e| panic!("{e}"));
        let attached: Vec<(&str, &str)> = (all.attached.iter())
            .map(|a| (a.driver.as_str(), a.claim.as_str()))
            .collect();
        assert_eq!(
            attached,
            [
                ("ebs.csi.aws.com", "default/data"),
                ("efs.csi.aws.com", "default/tmp"),
                ("ebs.csi.aws.com", "default/old")
            ]
        );
    }

    #[test]
    fn a_local_volume_does_not_tie_the_pod_to_its_old_host() {
        let hostname = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": HOSTNAME, "operator": "In", "values": ["old-node"]}]}]}});
        let objects = Objects::default()
            .claim("data", json!({"volumeName": "local-1"}))
            .volume(
                "local-1",
                json!({"local": {"path": "/mnt/disk"}, "nodeAffinity": hostname}),
            );
        let found = pod_volumes(&pod(claims(&["data"])), &objects).unwrap_or_else(|e| panic!("{e}"));
        assert!(found.requirements.is_empty(), "{found:?}");
    }

    #[test]
    fn an_ephemeral_volume_before_its_claim_exists_follows_its_templates_class() {
        let objects = Objects::default().class("zonal", &[&["a"]]);
        let ephemeral = json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
            "spec": {"storageClassName": "zonal", "accessModes": ["ReadWriteOnce"]}}}}]);
        let found = pod_volumes(&pod(ephemeral), &objects).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(zones(&found), [["a"]]);
    }

    #[test]
    fn a_missing_claim_volume_or_class_is_named_with_the_pods_volume() {
        let objects = Objects::default()
            .claim("bound", json!({"volumeName": "gone"}))
            .claim("classy", json!({"storageClassName": "missing"}));
        let error = |names: &[&str]| match pod_volumes(&pod(claims(names)), &objects) {
            Err(error) => error.to_string(),
            Ok(found) => panic!("accepted: {found:?}"),
        };
        assert_eq!(
            error(&["nope"]),
            "pod default/db-0: spec.volumes[0].persistentVolumeClaim.claimName: PersistentVolumeClaim default/nope not found"
        );
        assert!(error(&["bound"]).contains("bound to PersistentVolume gone, which does not exist"));
        assert!(
            error(&["classy"])
                .ends_with("PersistentVolumeClaim default/classy: StorageClass missing not found")
        );
    }
}
