//! The NodeClaim object for one new node the simulation opened: the NodePool's template, narrowed
//! to the simulation's requirements and the instance types that fit (cheapest first, at most
//! Karpenter's 600), owned by the NodePool and finalized by Joist.
//!
//! It carries the NodePool's hash and hash version (`karpenter.sh/nodepool-hash`), which drift is
//! judged by ([`joist_messages::apis::hash`]).
//!
//! Its labels are what the node will carry beyond the instance's own: the template's labels, the
//! NodePool and node class names, and one value for every custom requirement (a pool requiring
//! `company.com/team In [a, b]` whose pods select `team: a` gets `company.com/team=a`), as
//! Karpenter's launch writes them. Registration copies them onto the Node, so the simulation's
//! view of the claim in flight and the Node that registers agree.

use std::sync::Arc;

use joist_messages::{
    apis::{
        NodeClaim, NodeClaimSpec, NodePool, common::NodeSelectorRequirementWithMinValues,
        hash::nodepool_stamp, nodeclaim::ResourceRequirements,
    },
    labels::{EC2_NODE_CLASS, INSTANCE_TYPE, NODEPOOL, TERMINATION_FINALIZER, is_injectable},
    model::{
        instance_type::InstanceType,
        requirements::{Operator, Requirement},
    },
};
use joist_scheduling::NewClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;

/// The NodeClaim to create for `claim` (see the module docs).
pub fn node_claim(pool: &NodePool, claim: &NewClaim, instance_types: &[Arc<InstanceType>]) -> NodeClaim {
    let template = &pool.spec.template;
    let mut labels = claim.requirements.labels_to_inject(is_injectable);
    labels.extend(template.metadata.labels.clone());
    labels.insert(NODEPOOL.to_owned(), pool.name_any());
    labels.insert(
        EC2_NODE_CLASS.to_owned(),
        template.spec.node_class_ref.name.clone(),
    );
    let mut requirements = claim.requirements.clone();
    let names: Vec<&str> = claim
        .instance_types
        .iter()
        .filter_map(|&i| instance_types.get(i))
        .map(|it| it.name.as_str())
        .collect();
    // No instance types given (a static NodePool's template): the template's requirements alone.
    // Otherwise an In of known instance type names, which cannot be refused.
    if let Ok(types) = Requirement::new(INSTANCE_TYPE, Operator::In, names) {
        requirements.add(types);
    }
    let requirements: Vec<NodeSelectorRequirementWithMinValues> =
        requirements.entries().into_iter().map(Into::into).collect();
    let owner = OwnerReference {
        api_version: "karpenter.sh/v1".to_owned(),
        kind: "NodePool".to_owned(),
        name: pool.name_any(),
        uid: pool.uid().unwrap_or_default(),
        block_owner_deletion: Some(true),
        controller: None,
    };
    let mut annotations = template.metadata.annotations.clone();
    annotations.extend(nodepool_stamp(pool));
    NodeClaim {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", pool.name_any())),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            finalizers: Some(vec![TERMINATION_FINALIZER.to_owned()]),
            ..ObjectMeta::default()
        },
        spec: NodeClaimSpec {
            taints: template.spec.taints.clone(),
            startup_taints: template.spec.startup_taints.clone(),
            requirements,
            resources: ResourceRequirements {
                requests: claim
                    .requests
                    .iter()
                    .map(|(name, q)| (name.to_owned(), q))
                    .collect(),
            },
            node_class_ref: template.spec.node_class_ref.clone(),
            termination_grace_period: template.spec.termination_grace_period,
            expire_after: Some(template.spec.expire_after),
        },
        status: None,
    }
}
