//! Every NodeClaim of the cluster as a name, a node class and a provider ID, read from the API page
//! by page: what a replica that reflects only its own shards' NodeClaims
//! ([`crate::state::replica_shards`]) needs for the jobs that span every shard — the garbage collector,
//! the interruption queue, a node class's finalizer. Only those three fields are decoded, so a
//! cluster of 10,000 claims is a list of 10,000 short records, not of 10,000 claims with their
//! instance types.
//!
//! A failed page fails the whole read (the caller logs it and tries again later): a partial list
//! would make instances look leaked and classes look unused.

use kube::api::{ListParams, ObjectList};
use serde::Deserialize;

use crate::effects::kube_ops;

/// How many claims one page asks for.
const PAGE: u32 = 500;

/// One NodeClaim, as the cluster-wide jobs see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSummary {
    /// Its name.
    pub name: String,
    /// Its `spec.nodeClassRef.name`.
    pub node_class: String,
    /// Its `status.providerID`, once launched.
    pub provider_id: Option<String>,
}

impl ClaimSummary {
    /// Whether the claim's instance is `instance` (an EC2 instance ID, the provider ID's last part).
    pub fn is_instance(&self, instance: &str) -> bool {
        self.provider_id
            .as_deref()
            .is_some_and(|id| id.rsplit('/').next() == Some(instance))
    }
}

#[derive(Clone, Deserialize)]
struct Entry {
    metadata: EntryMeta,
    spec: EntrySpec,
    #[serde(default)]
    status: Option<EntryStatus>,
}

#[derive(Clone, Deserialize)]
struct EntryMeta {
    #[serde(default)]
    name: String,
}

#[derive(Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EntrySpec {
    node_class_ref: EntryRef,
}

#[derive(Clone, Deserialize)]
struct EntryRef {
    #[serde(default)]
    name: String,
}

#[derive(Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EntryStatus {
    #[serde(rename = "providerID", default)]
    provider_id: Option<String>,
}

/// Every NodeClaim of the cluster (see the module docs).
pub async fn every_claim(client: &kube::Client) -> Result<Vec<ClaimSummary>, kube::Error> {
    let api = kube_ops::cluster::<joist_messages::apis::NodeClaim>(client);
    let mut claims = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let request = kube::core::Request::new(api.resource_url())
            .list(&params)
            .map_err(kube::Error::BuildRequest)?;
        let page: ObjectList<Entry> = client.request(request).await?;
        claims.extend(page.items.into_iter().map(|entry| ClaimSummary {
            name: entry.metadata.name,
            node_class: entry.spec.node_class_ref.name,
            provider_id: entry.status.and_then(|s| s.provider_id),
        }));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(claims),
        }
    }
}
