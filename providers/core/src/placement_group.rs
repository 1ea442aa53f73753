//! Placement groups: what an EC2NodeClass's `placementGroupSelector` resolves to, and what that
//! changes for every provider, as Karpenter's AWS provider does it.
//!
//! - The group is resolved with the class (the cloud describes it by id or name, `available`
//!   groups only) and kept in [`Resolved`], in memory: Karpenter's EC2NodeClass status has no field
//!   for it, only the `PlacementGroupReady` condition.
//! - The class's instance types carry the group's id as a requirement
//!   (`karpenter.k8s.aws/placement-group-id`), so nodes are labelled with it; a partition group
//!   adds `karpenter.k8s.aws/placement-group-partition` with the values `1..=N`, so a pod may ask
//!   for a partition and a topology spread may count partitions as domains ([`constrain`]).
//! - A claim that asks for partitions launches into the smallest it allows ([`requested_partition`]);
//!   otherwise the cloud picks one and the node is labelled with it.
//! - Capacity errors inside a group mark offerings unavailable for that group only
//!   ([`crate::OfferingKey::placement_group`]), so they do not stop launches outside it; EC2's spread
//!   limit (seven running instances per zone in a rack-level spread group) marks every type in the
//!   zone ([`is_spread_limit`]).
//! - A claim whose group id is not the one its class resolves to now has drifted
//!   (`PlacementGroupDrift`, [`drift`]).
//!
//! Nothing here fails: a class whose group is not found is refused by the node class controller
//! (`PlacementGroupReady=False`, `PlacementGroupNotFound`), which keeps its NodePools from
//! launching.

use std::{
    collections::HashMap,
    fmt,
    future::Future,
    sync::{PoisonError, RwLock},
};

use joist_messages::{
    apis::{EC2NodeClass, NodeClaim, ec2nodeclass::PlacementGroupSelector},
    labels::aws::{PLACEMENT_GROUP_ID, PLACEMENT_GROUP_PARTITION},
    model::{
        instance_type::InstanceType,
        requirements::{Operator, Requirement, Requirements},
    },
};

use crate::{CloudError, Drift};

/// How a placement group places its instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Close together in one zone, for low latency.
    Cluster,
    /// In `partitions` partitions that share no racks.
    Partition {
        /// How many partitions the group has (EC2 allows up to seven per zone).
        partitions: u32,
    },
    /// Each instance on its own rack (at most [`SPREAD_LIMIT_PER_ZONE`] per zone).
    Spread,
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cluster => f.write_str("cluster"),
            Self::Partition { partitions } => write!(f, "partition ({partitions} partitions)"),
            Self::Spread => f.write_str("spread"),
        }
    }
}

/// How many running instances a rack-level spread group holds in one zone.
pub const SPREAD_LIMIT_PER_ZONE: usize = 7;

/// The words of EC2's error when a spread group is full in a zone.
const SPREAD_LIMIT_ERROR: &str = "limit of instances in this spread placement group";

/// A resolved placement group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementGroup {
    /// Its id (`pg-0123abcd`).
    pub id: String,
    /// Its name.
    pub name: String,
    /// How it places instances.
    pub strategy: Strategy,
}

impl PlacementGroup {
    /// The labels a node launched into this group carries: its id, and for a partition group the
    /// partition the instance landed in, when known.
    pub fn labels(&self, partition: Option<u32>) -> impl Iterator<Item = (String, String)> {
        let partition = partition.filter(|_| matches!(self.strategy, Strategy::Partition { .. }));
        std::iter::once((PLACEMENT_GROUP_ID.to_owned(), self.id.clone()))
            .chain(partition.map(|p| (PLACEMENT_GROUP_PARTITION.to_owned(), p.to_string())))
    }
}

/// The group `instance_type` launches into, when [`constrain`] made it one of a group's.
pub fn group_of(instance_type: &InstanceType) -> Option<&str> {
    instance_type
        .requirements
        .get(PLACEMENT_GROUP_ID)
        .filter(|r| r.operator() == Operator::In && r.len() == Some(1))
        .and_then(|r| r.values().next())
}

/// How a selector reads in a message: `name "hpc"` or `id "pg-1"`.
pub fn describe_selector(selector: &PlacementGroupSelector) -> String {
    match (&selector.name, &selector.id) {
        (Some(name), _) => format!("name {name:?}"),
        (None, Some(id)) => format!("id {id:?}"),
        (None, None) => "nothing".to_owned(),
    }
}

/// What each node class's selector resolved to, by class name (see the module docs): the
/// selector it was resolved for, and the group (`None`: no available group matched).
#[derive(Debug, Default)]
pub struct Resolved(RwLock<HashMap<String, (PlacementGroupSelector, Option<PlacementGroup>)>>);

impl Resolved {
    /// The group `class` launches into: `None` without a selector; what its selector resolved to
    /// last, or, the first time (or when the selector changed), what `describe` says now.
    pub async fn group<F, Fut>(
        &self,
        class: &EC2NodeClass,
        describe: F,
    ) -> Result<Option<PlacementGroup>, CloudError>
    where
        F: FnOnce(PlacementGroupSelector) -> Fut,
        Fut: Future<Output = Result<Option<PlacementGroup>, CloudError>>,
    {
        let Some(selector) = &class.spec.placement_group_selector else {
            return Ok(None);
        };
        let known = self
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(class_name(class))
            .filter(|(resolved_for, _)| resolved_for == selector)
            .map(|(_, group)| group.clone());
        match known {
            Some(group) => Ok(group),
            None => self.refresh(class, describe).await,
        }
    }

    /// Describes `class`'s group again with `describe` and remembers the answer (forgets the class
    /// when it has no selector).
    pub async fn refresh<F, Fut>(
        &self,
        class: &EC2NodeClass,
        describe: F,
    ) -> Result<Option<PlacementGroup>, CloudError>
    where
        F: FnOnce(PlacementGroupSelector) -> Fut,
        Fut: Future<Output = Result<Option<PlacementGroup>, CloudError>>,
    {
        let name = class_name(class).to_owned();
        let Some(selector) = class.spec.placement_group_selector.clone() else {
            self.0
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&name);
            return Ok(None);
        };
        let group = describe(selector.clone()).await?;
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name, (selector, group.clone()));
        Ok(group)
    }
}

fn class_name(class: &EC2NodeClass) -> &str {
    class.metadata.name.as_deref().unwrap_or_default()
}

/// The group `class` launches into, when it has one; [`CloudError::NodeClassNotReady`] when its
/// selector matched no group (`group` is what it resolved to).
pub fn required(
    class: &EC2NodeClass,
    group: Option<PlacementGroup>,
) -> Result<Option<PlacementGroup>, CloudError> {
    match (&class.spec.placement_group_selector, group) {
        (Some(selector), None) => Err(CloudError::NodeClassNotReady {
            node_class: class_name(class).to_owned(),
            reason: format!("placement group {} not found", describe_selector(selector)),
        }),
        (_, group) => Ok(group),
    }
}

/// Makes `types` launch into `group`, when there is one: each carries the group's id, and a
/// partition group's partitions, as requirements (see the module docs).
pub fn constrain(types: &mut [InstanceType], group: Option<&PlacementGroup>) {
    let Some(group) = group else {
        return;
    };
    let mut added = Requirements::default();
    let requirement = |key: &str, values: Vec<String>| {
        Requirement::new(key, Operator::In, values).unwrap_or_else(|e| unreachable!("{key}: {e}"))
    };
    added.add(requirement(PLACEMENT_GROUP_ID, vec![group.id.clone()]));
    if let Strategy::Partition { partitions } = group.strategy {
        let values = (1..=partitions).map(|p| p.to_string()).collect();
        added.add(requirement(PLACEMENT_GROUP_PARTITION, values));
    }
    for instance_type in types {
        instance_type.requirements.add_all(&added);
    }
}

/// The partition a claim with `requirements` launches into: the smallest its partition
/// requirement allows; `None` when it has none (the cloud picks).
pub fn requested_partition(requirements: &Requirements) -> Option<u32> {
    let allowed = requirements
        .get(PLACEMENT_GROUP_PARTITION)
        .filter(|r| r.operator() == Operator::In)?;
    allowed.values().filter_map(|v| v.parse::<u32>().ok()).min()
}

/// Whether EC2's error `message` says a spread group is full in the zone.
pub fn is_spread_limit(message: &str) -> bool {
    message.contains(SPREAD_LIMIT_ERROR)
}

/// An error in EC2's words for spread group `group` being full in a zone (the simulated cloud's).
pub fn spread_limit_message(group: &PlacementGroup) -> String {
    format!(
        "You have reached the {SPREAD_LIMIT_ERROR} ({} running instances per zone) for group {}",
        SPREAD_LIMIT_PER_ZONE, group.name
    )
}

/// `PlacementGroupDrift` when `claim`'s group (its `placement-group-id` label) is not the one its
/// class resolves to now (`group`): a group added, removed, or made anew under the same name.
pub fn drift(claim: &NodeClaim, group: Option<&PlacementGroup>) -> Option<Drift> {
    let had = claim
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(PLACEMENT_GROUP_ID))
        .map(String::as_str)
        .unwrap_or_default();
    let wanted = group.map(|g| g.id.as_str()).unwrap_or_default();
    (had != wanted).then(|| Drift {
        reason: "PlacementGroupDrift".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use joist_messages::model::{instance_type::Overhead, resources::Resources};

    use super::*;

    fn group(strategy: Strategy) -> PlacementGroup {
        PlacementGroup {
            id: "pg-1".into(),
            name: "hpc".into(),
            strategy,
        }
    }

    fn claim(labels: &[(&str, &str)]) -> NodeClaim {
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).into()))
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "c", "labels": labels},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                     "requirements": []}
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_partition_groups_types_offer_each_partition_and_carry_the_groups_id() {
        let mut types = vec![InstanceType {
            name: "c5.large".into(),
            requirements: Requirements::default(),
            offerings: Vec::new(),
            capacity: Resources::default(),
            overhead: Overhead::default(),
        }];
        constrain(&mut types, Some(&group(Strategy::Partition { partitions: 3 })));
        let partitions: Vec<&str> = types[0]
            .requirements
            .get(PLACEMENT_GROUP_PARTITION)
            .map(|r| r.values().collect())
            .unwrap_or_default();
        assert_eq!(partitions, ["1", "2", "3"]);
        let labels: Vec<(&str, &str)> = types[0].requirements.implied_labels().collect();
        assert_eq!(
            labels,
            [(PLACEMENT_GROUP_ID, "pg-1")],
            "one id, so a label; partitions are not"
        );
    }

    #[test]
    fn a_claim_launches_into_the_smallest_partition_it_allows() {
        let requirements: Requirements =
            Requirement::new(PLACEMENT_GROUP_PARTITION, Operator::In, ["10", "2"])
                .into_iter()
                .collect();
        assert_eq!(requested_partition(&requirements), Some(2));
        assert_eq!(requested_partition(&Requirements::default()), None);
    }

    #[test]
    fn a_claim_drifts_when_its_group_is_not_the_classs_any_more() {
        let in_group = claim(&[(PLACEMENT_GROUP_ID, "pg-1")]);
        assert_eq!(drift(&in_group, Some(&group(Strategy::Cluster))), None);
        let made_anew = PlacementGroup {
            id: "pg-2".into(),
            ..group(Strategy::Cluster)
        };
        let drifted = drift(&in_group, Some(&made_anew)).map(|d| d.reason);
        assert_eq!(drifted.as_deref(), Some("PlacementGroupDrift"));
        assert!(drift(&in_group, None).is_some(), "the selector was removed");
        assert!(
            drift(&claim(&[]), Some(&made_anew)).is_some(),
            "the selector was added"
        );
        assert_eq!(drift(&claim(&[]), None), None);
    }

    #[test]
    fn only_a_partition_groups_nodes_are_labelled_with_a_partition() {
        let partition = group(Strategy::Partition { partitions: 2 });
        let labels: Vec<(String, String)> = partition.labels(Some(2)).collect();
        assert_eq!(labels.len(), 2);
        assert_eq!(group(Strategy::Spread).labels(Some(2)).count(), 1);
        assert!(is_spread_limit(&spread_limit_message(&group(Strategy::Spread))));
    }
}
