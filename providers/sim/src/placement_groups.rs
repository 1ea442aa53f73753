//! The simulated cloud's placement groups: what DescribePlacementGroups would return, and where a
//! launch into a group may go, with the rules EC2 enforces.
//!
//! - A cluster group lives in one zone: once it has a running instance, a launch in another zone
//!   is refused as out of capacity (as EC2 answers it; Karpenter, and Joist, learn the zone that
//!   way, or from a NodePool pinned to it).
//! - A spread group holds at most [`SPREAD_LIMIT_PER_ZONE`] running instances per zone; one more
//!   is refused with EC2's spread-limit error.
//! - A partition group puts an instance in the partition asked for, or else in the one with the
//!   fewest running instances (the lowest on a tie), as EC2 spreads them.
//!
//! A group created again under a name it already has is a new group with a new id (the old one is
//! deleted), so the nodes launched into the old one drift. A deleted group is no longer described,
//! and its instances run on.

use std::collections::BTreeMap;

use joist_messages::apis::ec2nodeclass::PlacementGroupSelector;
use joist_provider::placement_group::{PlacementGroup, SPREAD_LIMIT_PER_ZONE, Strategy};

/// Why a launch into a group was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A cluster group's instances run in another zone.
    OtherZone {
        /// The group's zone.
        zone: String,
    },
    /// A spread group is full in the zone.
    SpreadLimit,
}

/// An instance running in a group.
#[derive(Debug, Clone)]
struct Member {
    group_id: String,
    zone: String,
    partition: Option<u32>,
}

/// Every group, and the instances running in them (see the module docs).
#[derive(Debug, Default)]
pub struct PlacementGroups {
    /// Groups by name.
    groups: BTreeMap<String, PlacementGroup>,
    /// Groups made so far (ids are `pg-sim` and this count).
    made: u32,
    /// Instances by id.
    members: BTreeMap<String, Member>,
}

impl PlacementGroups {
    /// Creates group `name` (replacing one of that name with a new group); returns its id.
    pub fn create(&mut self, name: &str, strategy: Strategy) -> String {
        self.made += 1;
        let id = format!("pg-0sim{:04}", self.made);
        self.groups.insert(
            name.to_owned(),
            PlacementGroup {
                id: id.clone(),
                name: name.to_owned(),
                strategy,
            },
        );
        id
    }

    /// Deletes group `name`; whether there was one.
    pub fn delete(&mut self, name: &str) -> bool {
        self.groups.remove(name).is_some()
    }

    /// The group `selector` names, by id or by name.
    pub fn describe(&self, selector: &PlacementGroupSelector) -> Option<PlacementGroup> {
        match (&selector.id, &selector.name) {
            (Some(id), _) => self.groups.values().find(|g| g.id == *id).cloned(),
            (None, Some(name)) => self.groups.get(name).cloned(),
            (None, None) => None,
        }
    }

    /// Where an instance of `group` in `zone` goes: its partition (for a partition group, the one
    /// `requested` or the emptiest), or why EC2 refuses it.
    pub fn admit(
        &self,
        group: &PlacementGroup,
        zone: &str,
        requested: Option<u32>,
    ) -> Result<Option<u32>, Refusal> {
        let members = || self.members.values().filter(|m| m.group_id == group.id);
        match group.strategy {
            Strategy::Cluster => match members().find(|m| m.zone != zone) {
                Some(other) => Err(Refusal::OtherZone {
                    zone: other.zone.clone(),
                }),
                None => Ok(None),
            },
            Strategy::Spread if members().filter(|m| m.zone == zone).count() >= SPREAD_LIMIT_PER_ZONE => {
                Err(Refusal::SpreadLimit)
            }
            Strategy::Spread => Ok(None),
            Strategy::Partition { partitions } => {
                if let Some(partition) = requested {
                    return Ok(Some(partition));
                }
                let mut counts: BTreeMap<u32, usize> = (1..=partitions).map(|p| (p, 0)).collect();
                for partition in members().filter_map(|m| m.partition) {
                    *counts.entry(partition).or_default() += 1;
                }
                Ok(counts
                    .into_iter()
                    .min_by_key(|&(partition, count)| (count, partition))
                    .map(|(partition, _)| partition))
            }
        }
    }

    /// Counts `instance` as running in `group`, in `zone` and `partition`.
    pub fn join(&mut self, instance: &str, group: &PlacementGroup, zone: &str, partition: Option<u32>) {
        let member = Member {
            group_id: group.id.clone(),
            zone: zone.to_owned(),
            partition,
        };
        self.members.insert(instance.to_owned(), member);
    }

    /// Stops counting `instance` (it ended).
    pub fn leave(&mut self, instance: &str) {
        self.members.remove(instance);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_name(name: &str) -> PlacementGroupSelector {
        PlacementGroupSelector {
            name: Some(name.into()),
            id: None,
        }
    }

    #[test]
    fn a_cluster_group_stays_in_the_zone_of_its_first_instance() {
        let mut groups = PlacementGroups::default();
        groups.create("hpc", Strategy::Cluster);
        let hpc = groups
            .describe(&by_name("hpc"))
            .unwrap_or_else(|| panic!("described"));
        assert_eq!(groups.admit(&hpc, "us-west-2b", None), Ok(None));
        groups.join("i-1", &hpc, "us-west-2b", None);
        assert_eq!(
            groups.admit(&hpc, "us-west-2a", None),
            Err(Refusal::OtherZone {
                zone: "us-west-2b".into()
            })
        );
        groups.leave("i-1");
        assert_eq!(groups.admit(&hpc, "us-west-2a", None), Ok(None), "empty again");
    }

    #[test]
    fn a_spread_group_takes_seven_per_zone() {
        let mut groups = PlacementGroups::default();
        groups.create("apart", Strategy::Spread);
        let apart = groups
            .describe(&by_name("apart"))
            .unwrap_or_else(|| panic!("described"));
        for i in 0..SPREAD_LIMIT_PER_ZONE {
            assert_eq!(groups.admit(&apart, "us-west-2a", None), Ok(None));
            groups.join(&format!("i-{i}"), &apart, "us-west-2a", None);
        }
        assert_eq!(
            groups.admit(&apart, "us-west-2a", None),
            Err(Refusal::SpreadLimit)
        );
        assert_eq!(groups.admit(&apart, "us-west-2b", None), Ok(None));
    }

    #[test]
    fn a_partition_group_fills_the_emptiest_partition_unless_one_is_asked_for() {
        let mut groups = PlacementGroups::default();
        groups.create("kafka", Strategy::Partition { partitions: 3 });
        let kafka = groups
            .describe(&by_name("kafka"))
            .unwrap_or_else(|| panic!("described"));
        let mut placed = Vec::new();
        for i in 0..4 {
            let partition = groups
                .admit(&kafka, "us-west-2a", None)
                .unwrap_or_else(|e| panic!("{e:?}"));
            groups.join(&format!("i-{i}"), &kafka, "us-west-2a", partition);
            placed.push(partition.unwrap_or_default());
        }
        assert_eq!(placed, [1, 2, 3, 1]);
        assert_eq!(groups.admit(&kafka, "us-west-2a", Some(3)), Ok(Some(3)));
    }

    #[test]
    fn a_group_made_anew_under_its_name_has_a_new_id_and_a_deleted_one_is_not_described() {
        let mut groups = PlacementGroups::default();
        let first = groups.create("hpc", Strategy::Cluster);
        let second = groups.create("hpc", Strategy::Cluster);
        assert_ne!(first, second);
        let by_id = PlacementGroupSelector {
            name: None,
            id: Some(second.clone()),
        };
        assert_eq!(groups.describe(&by_id).map(|g| g.id), Some(second));
        assert!(groups.delete("hpc"));
        assert_eq!(groups.describe(&by_name("hpc")), None);
    }
}
