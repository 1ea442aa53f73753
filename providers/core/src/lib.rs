//! The contract between Joist's controllers and a cloud: the [`CloudProvider`] trait, the domain
//! types it speaks ([`Instance`], [`Launch`], [`OfferingKey`]) and its typed errors ([`CloudError`]).
//!
//! The actors hold an `Arc<dyn CloudProvider>` and never learn which cloud is behind it: the AWS
//! provider in production, the simulated cloud in `joist simulate` and the tests. Every method
//! returns a boxed future so the trait stays object-safe; errors say whether a retry can help
//! ([`CloudError::is_retryable`]) and which offerings ran out of capacity, so the unavailable-offering
//! cache can route the next attempt elsewhere. [`interruption`] is the other channel a cloud speaks
//! through: the queue of interruption events (SQS on AWS, an in-memory queue in the simulated
//! cloud), read the same way for both.

pub mod capacity_reservation;
mod error;
pub mod instance_status;
pub mod interruption;
pub mod launch;
pub mod node_class;
pub mod placement_group;
pub mod prices;
pub mod provider_id;
pub mod repair;

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    sync::Arc,
};

use futures::future::BoxFuture;
use joist_messages::{
    apis::{EC2NodeClass, EC2NodeClassStatus, NodeClaim, NodePool},
    model::{
        instance_type::{CapacityType, InstanceType, Reservation},
        resources::Resources,
    },
};
use serde::{Deserialize, Serialize};

pub use error::CloudError;

/// A future a provider returns.
pub type CloudFuture<'a, T> = BoxFuture<'a, Result<T, CloudError>>;

/// One way to buy one instance type: `capacityType:instanceType:zone`, with `:placementGroup` when
/// it is scoped to one; the key of the unavailable-offering cache.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OfferingKey {
    /// The instance type (`m5.large`).
    pub instance_type: String,
    /// The zone (`us-west-2a`).
    pub zone: String,
    /// Spot, on-demand or reserved.
    pub capacity_type: CapacityType,
    /// The placement group (its id) the offering ran out in; `None` for the zone as a whole.
    /// Capacity missing inside a group says nothing of launches outside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_group: Option<String>,
}

impl OfferingKey {
    /// Whether this key marks `instance_type`'s offerings: any type's, or only those launching
    /// into its placement group.
    pub fn covers(&self, instance_type: &InstanceType) -> bool {
        self.instance_type == instance_type.name
            && self
                .placement_group
                .as_deref()
                .is_none_or(|group| placement_group::group_of(instance_type) == Some(group))
    }
}

impl fmt::Display for OfferingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.capacity_type, self.instance_type, self.zone)?;
        match &self.placement_group {
            Some(group) => write!(f, ":{group}"),
            None => Ok(()),
        }
    }
}

/// What a successful launch tells the NodeClaim: the instance, and what its node will offer.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// The instance that was launched.
    pub instance: Instance,
    /// The node's capacity.
    pub capacity: Resources,
    /// The node's allocatable resources (capacity less kubelet and system reservations).
    pub allocatable: Resources,
    /// Labels the node will carry (instance type, zone, capacity type, `karpenter.k8s.aws/*` …).
    pub labels: BTreeMap<String, String>,
    /// Offerings that were tried and had no capacity before one succeeded.
    pub unavailable: Vec<OfferingKey>,
}

/// Where an instance is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceState {
    /// Booting.
    Pending,
    /// Up.
    Running,
    /// Being reclaimed or terminated.
    ShuttingDown,
    /// Gone.
    Terminated,
}

/// An instance as the cloud reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    /// The Kubernetes provider ID (`aws:///us-west-2a/i-0123…`).
    pub provider_id: String,
    /// The instance type.
    pub instance_type: String,
    /// The zone.
    pub zone: String,
    /// How it was bought.
    pub capacity_type: CapacityType,
    /// The capacity reservation it runs in, while it is `reserved`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<Reservation>,
    /// The image it booted.
    pub image_id: String,
    /// Hourly price of its offering.
    pub price: f64,
    /// Where it is in its life.
    pub state: InstanceState,
    /// Seconds since the Unix epoch when it was launched.
    pub launched_at: i64,
    /// Its tags (`karpenter.sh/nodepool`, `karpenter.sh/nodeclaim`, …).
    pub tags: BTreeMap<String, String>,
}

/// Why a NodeClaim's instance no longer matches what its NodePool or node class asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    /// The drift reason Karpenter reports (`AMIDrift`, `SubnetDrift`, `NodeClassDrift` …).
    pub reason: String,
}

/// A cloud Joist can launch nodes in (see the module docs).
pub trait CloudProvider: Send + Sync + 'static {
    /// The provider's name (`aws`, `sim`).
    fn name(&self) -> &'static str;

    /// Launches an instance for `claim` through `node_class` (the claim's, as the controllers
    /// see it: checked with [`node_class::launchable`]), choosing among `instance_types` (its
    /// NodePool's, as [`instance_types`](Self::instance_types) listed them, with offerings known to
    /// be out of capacity marked unavailable) the offerings its requirements and requests allow.
    fn create<'a>(
        &'a self,
        claim: &'a NodeClaim,
        node_class: Option<&'a EC2NodeClass>,
        instance_types: &'a [Arc<InstanceType>],
    ) -> CloudFuture<'a, Launch>;

    /// The launch an earlier [`create`](Self::create) for `claim` made, if its instance still runs
    /// and the cloud can tell: after a crash lost `create`'s reply, the NodeClaim adopts that
    /// instance instead of launching a second one. `None` when there is none, or when the cloud
    /// cannot find it (then the claim launches again and the garbage collector removes the first).
    fn find_launch<'a>(
        &'a self,
        claim: &'a NodeClaim,
        instance_types: &'a [Arc<InstanceType>],
    ) -> CloudFuture<'a, Option<Launch>>;

    /// Terminates the instance; [`CloudError::NodeClaimNotFound`] once it is gone.
    fn delete<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, ()>;

    /// The instance behind a provider ID; [`CloudError::NodeClaimNotFound`] when there is none.
    fn get<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, Instance>;

    /// Every instance this cluster's Joist launched, terminated ones excluded.
    fn list(&self) -> CloudFuture<'_, Vec<Instance>>;

    /// The instance types `node_pool` can launch through `node_class`, with their offerings.
    fn instance_types<'a>(
        &'a self,
        node_pool: &'a NodePool,
        node_class: &'a EC2NodeClass,
    ) -> CloudFuture<'a, Vec<InstanceType>>;

    /// Resolves a node class (subnets, security groups, images …) into the status to publish.
    fn resolve_node_class<'a>(&'a self, node_class: &'a EC2NodeClass) -> CloudFuture<'a, EC2NodeClassStatus>;

    /// Resolves `node_class`'s `placementGroupSelector` afresh and remembers the answer for its
    /// launches ([`placement_group::Resolved`]): `None` without a selector, or when no available
    /// group matches it.
    fn resolve_placement_group<'a>(
        &'a self,
        node_class: &'a EC2NodeClass,
    ) -> CloudFuture<'a, Option<placement_group::PlacementGroup>>;

    /// Whether the claim's instance has drifted from what its node class (a Ready one, its status
    /// as resolved now) selects; `None` also when the claim has no instance yet.
    fn is_drifted<'a>(
        &'a self,
        claim: &'a NodeClaim,
        node_class: &'a EC2NodeClass,
    ) -> CloudFuture<'a, Option<Drift>>;

    /// Names the instance after the Node it registered as (EC2's `Name` tag, as Karpenter's
    /// tagging controller writes it once the Node is known); [`CloudError::NodeClaimNotFound`] when
    /// the instance is gone.
    fn name_instance<'a>(&'a self, provider_id: &'a str, node_name: &'a str) -> CloudFuture<'a, ()>;

    /// The Node conditions that mean one of this cloud's instances is broken (see [`repair`]).
    fn repair_policies(&self) -> &'static [repair::RepairPolicy];

    /// The instances whose status checks are impaired or that have a scheduled event, as the
    /// cloud reports them now (see [`instance_status`]); [`CloudError::NotPermitted`] when the
    /// cloud refuses the query.
    fn impaired_instances(&self) -> CloudFuture<'_, Vec<instance_status::InstanceHealth>>;

    /// How many instances each capacity reservation can still take, as this provider counts them
    /// ([`capacity_reservation::Availability`]): the controllers' catalog reads it before every
    /// solve, since launches and terminations change it between listings.
    fn reserved_capacity(&self) -> HashMap<String, u32>;

    /// Counts the capacity reservation `id` as full until it is next described: EC2 warned that
    /// it takes an interruptible reservation's capacity back.
    fn reservation_reclaimed(&self, id: &str);
}
