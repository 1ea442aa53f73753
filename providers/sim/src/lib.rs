//! A simulated cloud for Joist: real EC2 instance shapes and prices ([`catalog`]), instances that
//! boot after a delay and register as Nodes through the Kubernetes API ([`node`]), spot
//! interruptions ([`cloud`]), and injectable faults: capacity outages, calls that are throttled,
//! hang or lose their replies, and instances that never register or never turn Ready, with a log
//! of every call ([`faults`]).
//!
//! Images: a class selecting an alias at `@latest` boots the family's newest image, which a
//! scenario can replace ([`SimCloud::release_image`]); other terms boot one fixed image. An
//! instance whose image its class no longer resolves to has drifted (`AMIDrift`), as one whose
//! zone the class's subnets no longer cover (`SubnetDrift`).
//!
//! On a real control plane, [`SimCloud::on_kwok`] registers Nodes that KWOK plays the kubelet of,
//! selling the built-in catalog or the types of a Karpenter KWOK instance-types file ([`kwok`]).
//!
//! [`SimCloud`] implements [`CloudProvider`], so the actors drive it exactly as they drive AWS. It
//! fails the way EC2 does: an offering in an outage returns `InsufficientCapacity` (after the
//! cheaper offerings it tried), a missing or unready EC2NodeClass returns `NodeClassNotReady`, and
//! an unknown provider ID returns `NodeClaimNotFound`.

pub mod catalog;
pub mod cloud;
pub mod faults;
pub mod kwok;
mod listings;
pub mod node;
mod placement_groups;
pub mod queue;
mod reservations;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

use joist_messages::{
    apis::{
        EC2NodeClass, EC2NodeClassStatus, NodeClaim, NodePool,
        ec2nodeclass::{
            CapacityReservation, PlacementGroupSelector, ResolvedAmi, ResolvedSecurityGroup, ResolvedSubnet,
        },
    },
    labels::{ARCH, tags},
    model::{
        instance_type::{CapacityType, InstanceType},
        shape::Ec2Shape,
    },
};
use joist_provider::{
    CloudError, CloudFuture, CloudProvider, Drift, Instance, InstanceState, Launch, capacity_reservation,
    instance_status::{InstanceHealth, StatusCategory, StatusCheck},
    interruption::{InterruptionQueue, QueueMessage},
    launch,
    placement_group::{self, PlacementGroup, Strategy},
    provider_id::instance_id,
    repair::{EC2_REPAIR_POLICIES, RepairPolicy},
};
use k8s_openapi::api::core::v1::Node;
use kube::{
    ResourceExt,
    api::{Api, DeleteParams, PostParams},
};

pub use self::{
    catalog::{Catalog, CatalogError},
    cloud::{Books, CloudEvent, EndReason, INTERRUPTION_NOTICE, InstanceRecord, SimSettings},
    faults::{BootFault, Call, CallLog, Failure, OfferingPattern, Operation},
    reservations::{OWNER_ID, SimReservation},
};
use self::{
    cloud::Tracked,
    listings::Listings,
    node::{Registration, node_name},
    placement_groups::{PlacementGroups, Refusal},
    queue::SimQueue,
    reservations::Reservations,
};

/// The image instances boot unless their class selects an alias at `@latest`.
const IMAGE_ID: &str = "ami-0sim0000000000000";

/// The simulated cloud (see the crate docs). Cheap to clone; clones share the cloud.
#[derive(Clone)]
pub struct SimCloud {
    inner: Arc<Inner>,
}

struct Inner {
    settings: SimSettings,
    /// Every type sold, with the hardware it was made from (none for a type from a KWOK file).
    types: Vec<(Option<Ec2Shape>, InstanceType)>,
    /// Who plays the kubelet of the Nodes the cloud registers.
    kubelet: Kubelet,
    client: kube::Client,
    books: Books,
    /// On KWOK, the readings of the instances back from their Nodes.
    listings: Listings,
    queue: Arc<SimQueue>,
    /// Images released since the start, per AMI family (none: the family's first image).
    releases: std::sync::Mutex<BTreeMap<String, u32>>,
    /// Launches of claims alike rank the catalog once.
    candidates: std::sync::Mutex<launch::CandidateMemo>,
    /// The capacity reservations, as EC2 holds them.
    reservations: std::sync::Mutex<Reservations>,
    /// The room in each reservation as the provider counts it (what the controllers see).
    reservation_room: capacity_reservation::Availability,
    /// The placement groups, as EC2 holds them.
    placement_groups: std::sync::Mutex<PlacementGroups>,
    /// The placement group each class resolved to (what the controllers see).
    resolved_groups: placement_group::Resolved,
}

/// Who plays the kubelet of the Nodes the simulated cloud registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kubelet {
    /// kubesim's kubelets: `joist simulate`, `joist sim serve`.
    Kubesim,
    /// KWOK, on a real control plane: Nodes carry its annotation ([`kwok::for_kwok`]).
    Kwok,
}

impl SimCloud {
    /// A cloud selling the built-in catalog of `settings.region`, registering nodes through `client`
    /// for kubesim's kubelets.
    pub fn new(settings: SimSettings, client: kube::Client) -> Result<Self, CatalogError> {
        let types = Self::built_in(&settings)?;
        Ok(Self::selling(settings, client, types, Kubelet::Kubesim))
    }

    /// A cloud whose Nodes KWOK runs, selling `types` (from a KWOK instance-types file,
    /// [`kwok::instance_types`]) or, when none are given, the built-in catalog of
    /// `settings.region`.
    pub fn on_kwok(
        settings: SimSettings,
        client: kube::Client,
        types: Option<Vec<InstanceType>>,
    ) -> Result<Self, CatalogError> {
        let types = match types {
            Some(types) => types.into_iter().map(|it| (None, it)).collect(),
            None => Self::built_in(&settings)?,
        };
        Ok(Self::selling(settings, client, types, Kubelet::Kwok))
    }

    /// The built-in catalog of `settings.region`, with each type's hardware.
    fn built_in(settings: &SimSettings) -> Result<Vec<(Option<Ec2Shape>, InstanceType)>, CatalogError> {
        let catalog = Catalog::load(&settings.region, &settings.zones)?;
        Ok(catalog
            .iter()
            .map(|listing| {
                let instance_type = listing.instance_type(&settings.region, &settings.capacity);
                (Some(listing.shape.clone()), instance_type)
            })
            .collect())
    }

    fn selling(
        settings: SimSettings,
        client: kube::Client,
        types: Vec<(Option<Ec2Shape>, InstanceType)>,
        kubelet: Kubelet,
    ) -> Self {
        let books = Books::new(settings.seed);
        Self {
            inner: Arc::new(Inner {
                settings,
                types,
                kubelet,
                client,
                books,
                listings: Listings::default(),
                queue: Arc::default(),
                releases: std::sync::Mutex::default(),
                candidates: std::sync::Mutex::default(),
                reservations: std::sync::Mutex::default(),
                reservation_room: capacity_reservation::Availability::default(),
                placement_groups: std::sync::Mutex::default(),
                resolved_groups: placement_group::Resolved::default(),
            }),
        }
    }

    /// Releases a new image for the AMI `family` (`al2023`): classes selecting `family@latest`
    /// resolve to it from their next resolution, and the instances booted from the old one drift.
    /// Returns the new image's id.
    pub fn release_image(&self, family: &str) -> String {
        let generation = {
            let mut releases = self.releases();
            let generation = releases.entry(family.to_owned()).or_default();
            *generation += 1;
            *generation
        };
        let image = image_id(family, generation);
        let mut state = self.inner.books.lock();
        let event = CloudEvent::ImageReleased {
            family: family.to_owned(),
            image: image.clone(),
        };
        self.inner.books.record(&mut state, event);
        image
    }

    /// Images released per family (a poisoned lock still holds a consistent map).
    fn releases(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u32>> {
        self.inner
            .releases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The image `class` resolves to now: its alias family's newest at `@latest`, the family's
    /// first for a pinned version, [`IMAGE_ID`] for other terms.
    fn image_for(&self, class: &EC2NodeClass) -> String {
        let Some((family, version)) = class
            .spec
            .ami_selector_terms
            .iter()
            .find_map(|t| t.alias.as_deref()?.split_once('@'))
        else {
            return IMAGE_ID.to_owned();
        };
        let generation = if version == "latest" {
            self.releases().get(family).copied().unwrap_or(0)
        } else {
            0
        };
        image_id(family, generation)
    }

    /// The cloud's books: instances, events, costs.
    pub fn books(&self) -> &Books {
        &self.inner.books
    }

    /// Seconds since the Unix epoch, on the simulation's clock.
    pub fn now(&self) -> i64 {
        self.inner.settings.epoch_seconds + self.inner.books.elapsed() as i64
    }

    /// Takes a Node that exists already (restored from a snapshot of a cluster) into the books as
    /// a running instance of this cloud: its provider ID, its instance type, zone and capacity
    /// type from its labels, its NodeClaim (`claim`) as its tag, its price from the catalog (0 for
    /// an offering the catalog does not sell). A Node without a provider ID or one of those labels
    /// is not taken (`false`).
    pub fn adopt_node(&self, node: &Node, claim: Option<&str>) -> bool {
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let label = |key: &str| labels.get(key).cloned();
        let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.clone());
        let capacity_type =
            label(joist_messages::labels::CAPACITY_TYPE).and_then(|c| CapacityType::from_label(&c));
        let (Some(provider_id), Some(instance_type), Some(zone), Some(capacity_type)) = (
            provider_id,
            label(joist_messages::labels::INSTANCE_TYPE),
            label(joist_messages::labels::ZONE),
            capacity_type,
        ) else {
            return false;
        };
        let mut instance_tags: BTreeMap<String, String> = label(joist_messages::labels::NODEPOOL)
            .map(|pool| (tags::NODEPOOL.to_owned(), pool))
            .into_iter()
            .collect();
        if let Some(claim) = claim {
            instance_tags.insert(tags::NODECLAIM.to_owned(), claim.to_owned());
        }
        let mut instance = Instance {
            provider_id,
            instance_type,
            zone,
            capacity_type,
            reservation: None,
            image_id: String::new(),
            price: 0.0,
            state: InstanceState::Running,
            launched_at: self.now(),
            tags: instance_tags,
        };
        instance.price = self.price(&instance).unwrap_or_default();
        let name = node.metadata.name.clone().unwrap_or_default();
        self.inner.books.adopt(instance, name, labels);
        true
    }

    fn reservations(&self) -> std::sync::MutexGuard<'_, Reservations> {
        self.inner
            .reservations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Creates a capacity reservation (or replaces the one with its id): classes whose terms
    /// select it offer it from their next resolution.
    pub fn add_reservation(&self, reservation: SimReservation) {
        self.reservations().add(reservation);
    }

    /// Cancels the reservation `id`, as its owner may: its instances keep running as on-demand
    /// instances. Returns the instances it held; none when there is no such reservation.
    pub fn cancel_reservation(&self, id: &str) -> Vec<String> {
        if !self.reservations().cancel(id) {
            return Vec::new();
        }
        let mut state = self.inner.books.lock();
        state
            .instances
            .iter_mut()
            .filter(|(_, t)| {
                t.record.ended.is_none() && t.record.instance.reservation.as_ref().is_some_and(|r| r.id == id)
            })
            .map(|(instance_id, t)| {
                t.record.instance.capacity_type = CapacityType::OnDemand;
                t.record.instance.reservation = None;
                instance_id.clone()
            })
            .collect()
    }

    /// The reservations `class` selects, as its status lists them; each one's room is counted
    /// afresh, as a DescribeCapacityReservations does.
    fn described_reservations(&self, class: &EC2NodeClass) -> Vec<CapacityReservation> {
        let terms = &class.spec.capacity_reservation_selector_terms;
        let described = self.reservations().describe(terms, self.now());
        described
            .into_iter()
            .map(|(entry, room)| {
                self.inner.reservation_room.sync(&entry.id, room);
                entry
            })
            .collect()
    }

    fn placement_groups(&self) -> std::sync::MutexGuard<'_, PlacementGroups> {
        self.inner
            .placement_groups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Creates placement group `name` (a new group with a new id when one of that name exists, so
    /// the nodes launched into the old one drift); returns its id.
    pub fn create_placement_group(&self, name: &str, strategy: Strategy) -> String {
        self.placement_groups().create(name, strategy)
    }

    /// Deletes placement group `name`: it is no longer described; its instances run on. Whether
    /// there was one.
    pub fn delete_placement_group(&self, name: &str) -> bool {
        self.placement_groups().delete(name)
    }

    /// The placement group `class` launches into, as the controllers last resolved it.
    async fn placement_group(&self, class: &EC2NodeClass) -> Result<Option<PlacementGroup>, CloudError> {
        (self.inner.resolved_groups)
            .group(class, |selector| async move {
                Ok(self.placement_groups().describe(&selector))
            })
            .await
    }

    /// Makes every call of `operation` fail as `failure` says for `duration`. The interruption
    /// queue is only ever throttled: a hang or a lost reply there is SQS's visibility timeout's
    /// business, which the queue already models.
    pub fn fail(&self, operation: Operation, failure: Failure, duration: Duration) {
        match operation {
            Operation::ReceiveMessages => self.inner.queue.fail(duration),
            _ => self.inner.books.fail(operation, failure, duration),
        }
    }

    /// Makes the offerings `pattern` covers refuse launches for `duration`.
    pub fn make_unavailable(&self, pattern: OfferingPattern, duration: Duration) {
        self.inner.books.make_unavailable(pattern, duration);
    }

    /// Makes instances launched in the next `duration` come up broken as `fault` says.
    pub fn break_boots(&self, fault: BootFault, duration: Duration) {
        self.inner.books.break_boots(fault, duration);
    }

    /// The interruption queue this cloud's warnings go to, as EventBridge puts them on SQS.
    pub fn queue(&self) -> Arc<SimQueue> {
        self.inner.queue.clone()
    }

    /// Sends the two-minute warning to up to `count` running instances whose nodes carry every
    /// label of `selector` (an EC2 Spot Instance Interruption Warning on the queue), and reclaims
    /// them when it runs out. Returns their ids.
    pub fn interrupt(&self, selector: &BTreeMap<String, String>, count: usize) -> Vec<String> {
        let chosen = self.inner.books.pick(selector, count);
        for id in &chosen {
            self.warn(id);
        }
        chosen
    }

    /// Makes a status check of up to `count` running instances whose nodes carry every label of
    /// `selector` fail from now on, as EC2 reports a broken instance or host, or schedules
    /// maintenance for them ([`StatusCategory::Event`]). Returns their ids.
    pub fn impair(
        &self,
        selector: &BTreeMap<String, String>,
        count: usize,
        category: StatusCategory,
    ) -> Vec<String> {
        let chosen = self.inner.books.pick(selector, count);
        let name = match category {
            StatusCategory::Instance | StatusCategory::System => "reachability",
            StatusCategory::Event => "system-maintenance",
        };
        let check = StatusCheck {
            category,
            name: name.to_owned(),
            failed: true,
            impaired_since: Some(self.inner.settings.epoch_seconds + self.inner.books.elapsed() as i64),
        };
        self.inner.books.impair(&chosen, &check);
        chosen
    }

    /// Sends instance `id` the two-minute warning and reclaims it when it runs out.
    fn warn(&self, id: &str) {
        {
            let mut state = self.inner.books.lock();
            let event = CloudEvent::InterruptionWarning {
                instance: id.to_owned(),
            };
            self.inner.books.record(&mut state, event);
        }
        self.inner.queue.send(self.spot_warning(id));
        let cloud = self.clone();
        let id = id.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(INTERRUPTION_NOTICE).await;
            cloud.end(&id, EndReason::SpotInterruption).await;
        });
    }

    /// On KWOK, warns each running instance whose Node asks for an interruption and has not been
    /// warned yet ([`kwok::INTERRUPT_ANNOTATION`]).
    async fn interrupt_annotated(&self) -> Result<(), CloudError> {
        for listed in kwok::listed(&self.inner.client).await? {
            let id = instance_id(&listed.instance.provider_id).to_owned();
            if !listed.interrupt || self.inner.books.was_warned(&id) {
                continue;
            }
            self.inner
                .books
                .adopt(listed.instance, listed.node_name, listed.labels);
            tracing::info!(
                instance = id,
                "interrupting the instance its node asks to be interrupted"
            );
            self.warn(&id);
        }
        Ok(())
    }

    /// The EventBridge event AWS sends two minutes before it reclaims spot instance `id`.
    fn spot_warning(&self, id: &str) -> String {
        let settings = &self.inner.settings;
        let now = settings.epoch_seconds + self.inner.books.elapsed() as i64;
        serde_json::json!({
            "version": "0",
            "id": format!("sim-warning-{id}"),
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "source": "aws.ec2",
            "account": "000000000000",
            "time": joist_messages::time::rfc3339(now),
            "region": settings.region,
            "resources": [format!("arn:aws:ec2:{}:instance/{id}", settings.region)],
            "detail": {"instance-id": id, "instance-action": "terminate"},
        })
        .to_string()
    }

    /// Ends an instance and removes its Node, as the cloud controller manager would.
    async fn end(&self, instance_id: &str, reason: EndReason) {
        let Some(node) = self.release(instance_id, reason) else {
            return;
        };
        let nodes: Api<Node> = Api::all(self.inner.client.clone());
        match nodes.delete(&node, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => tracing::warn!(%node, %error, "removing the node of a terminated instance failed"),
        }
    }

    /// Ends a running instance in the books and gives back its place in a placement group and
    /// its reservation; the name of its Node, or `None` when it was not running.
    fn release(&self, instance_id: &str, reason: EndReason) -> Option<String> {
        let reservation = self
            .inner
            .books
            .lock()
            .instances
            .get(instance_id)
            .and_then(|t| t.record.instance.reservation.clone());
        let node = self.inner.books.end(instance_id, reason)?;
        self.placement_groups().leave(instance_id);
        if let Some(reservation) = reservation {
            self.reservations().release(&reservation.id);
            self.inner.reservation_room.terminated(&reservation.id);
        }
        Some(node)
    }

    fn launch(
        &self,
        claim: &NodeClaim,
        (node_class, group): (&EC2NodeClass, Option<&PlacementGroup>),
        instance_types: &[Arc<InstanceType>],
    ) -> Result<Launch, CloudError> {
        let settings = &self.inner.settings;
        let books = &self.inner.books;
        let mut unavailable = Vec::new();
        let requested_partition = placement_group::requested_partition(&launch::claim_requirements(claim)?);
        let mut refusal = None;
        let candidates = self
            .inner
            .candidates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .candidates(claim, instance_types)?;
        let now = self.now();
        let mut state = books.lock();
        for candidate in candidates {
            let key = candidate.key();
            let reservation = candidate.offering.reservation.as_ref().map(|r| &r.reservation);
            if let Some(reservation) = reservation
                && !self.reservations().take(&reservation.id, now)
            {
                // EC2's ReservationCapacityExceeded: the reservation has no room, which says
                // nothing of the type's other offerings in the zone, so the offering cache is
                // left alone and only the reservation's count is emptied.
                self.inner.reservation_room.exhausted(&reservation.id);
                books.record(&mut state, CloudEvent::InsufficientCapacity { offering: key });
                continue;
            }
            // Out of capacity: an outage the scenario set, or the group's rule EC2 enforces.
            let admitted = match group {
                _ if state.faults.is_unavailable(&key) => Err(None),
                Some(group) => (self.placement_groups())
                    .admit(group, &key.zone, requested_partition)
                    .map_err(|refused| Some(refusal_message(group, refused))),
                None => Ok(None),
            };
            let partition = match admitted {
                Ok(partition) => partition,
                Err(message) => {
                    refusal = message.or(refusal);
                    let event = CloudEvent::InsufficientCapacity {
                        offering: key.clone(),
                    };
                    books.record(&mut state, event);
                    unavailable.push(key);
                    continue;
                }
            };
            // On KWOK an instance is its Node, as in Karpenter's KWOK provider: the provider ID
            // `kwok://NODE`, so either controller finds the instances the other launched.
            let kubelet = self.inner.kubelet;
            let (instance_id, ordinal) = books.next_instance_id(&mut state, |id| match kubelet {
                Kubelet::Kubesim => id.to_owned(),
                Kubelet::Kwok => kwok::node_name(id, &settings.region),
            });
            let (name, provider_id) = match kubelet {
                Kubelet::Kubesim => (
                    node_name(ordinal, &settings.region, settings.network),
                    format!("aws:///{}/{instance_id}", key.zone),
                ),
                Kubelet::Kwok => (
                    instance_id.clone(),
                    format!("{}{instance_id}", kwok::PROVIDER_PREFIX),
                ),
            };
            let it = candidate.instance_type;
            let mut labels = launch::node_labels(
                it,
                &settings.region,
                &key.zone,
                key.capacity_type.label(),
                node_class,
            );
            labels.extend(claim.labels().iter().map(|(k, v)| (k.clone(), v.clone())));
            if let Some(reservation) = reservation {
                labels.extend(reservation.labels().map(|(k, v)| (k.to_owned(), v)));
                self.inner.reservation_room.launched(&reservation.id);
            }
            if let Some(group) = group {
                labels.extend(group.labels(partition));
                (self.placement_groups()).join(&instance_id, group, &key.zone, partition);
            }
            let instance = Instance {
                provider_id,
                instance_type: it.name.clone(),
                zone: key.zone.clone(),
                capacity_type: key.capacity_type,
                reservation: reservation.cloned(),
                image_id: node_class
                    .status
                    .iter()
                    .flat_map(|s| &s.amis)
                    .next()
                    .map_or_else(|| IMAGE_ID.to_owned(), |a| a.id.clone()),
                price: candidate.offering.price,
                state: InstanceState::Pending,
                launched_at: settings.epoch_seconds + books.elapsed() as i64,
                tags: self.tags(node_class, claim),
            };
            let mut taints = claim.spec.taints.clone();
            taints.extend(claim.spec.startup_taints.iter().cloned());
            let allocatable = it.allocatable();
            let registration = Registration {
                name: &name,
                provider_id: &instance.provider_id,
                labels: &labels,
                taints: &taints,
                capacity: &it.capacity,
                allocatable: &allocatable,
                arch: labels.get(ARCH).map_or("amd64", String::as_str),
            }
            .node();
            let registration = match self.inner.kubelet {
                Kubelet::Kubesim => registration,
                Kubelet::Kwok => kwok::for_kwok(registration, &instance),
            };
            let boot = match state.faults.boot_fault() {
                Some(BootFault::NeverRegisters) => None,
                Some(BootFault::NeverReady) => Some(never_ready(registration)),
                None => Some(registration),
            }
            .map(|node| {
                let booting = Booting {
                    client: self.inner.client.clone(),
                    books: books.clone(),
                    instance_id: instance_id.clone(),
                };
                tokio::spawn(booting.register(node, settings.boot))
            });
            let event = CloudEvent::Launched {
                instance: instance_id.clone(),
                offering: key,
                price: instance.price,
            };
            books.record(&mut state, event);
            let launched = books.elapsed();
            state.instances.insert(
                instance_id,
                Tracked {
                    record: InstanceRecord {
                        instance: instance.clone(),
                        node_name: name,
                        launched,
                        ended: None,
                        end_reason: None,
                    },
                    labels: labels.clone(),
                    health: Vec::new(),
                    boot,
                    registered: false,
                },
            );
            return Ok(Launch {
                instance,
                capacity: it.capacity.clone(),
                allocatable,
                labels,
                unavailable,
            });
        }
        Err(CloudError::InsufficientCapacity {
            offerings: unavailable,
            message: refusal.unwrap_or_else(|| {
                "InsufficientInstanceCapacity: every offering the claim allows is out of capacity".to_owned()
            }),
        })
    }

    /// The instance's tags: Karpenter's, and the NodeClaim's name at once (the simulated cloud
    /// launches one instance a call).
    fn tags(&self, node_class: &EC2NodeClass, claim: &NodeClaim) -> BTreeMap<String, String> {
        let mut instance_tags =
            joist_provider::launch::instance_tags(&self.inner.settings.cluster_name, node_class, claim);
        instance_tags.insert(
            tags::NODECLAIM.to_owned(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        instance_tags
    }

    /// The running instance an earlier launch for the NodeClaim `name` started, as a launch.
    fn find_tagged(&self, name: &str, instance_types: &[Arc<InstanceType>]) -> Option<Launch> {
        let state = self.inner.books.lock();
        let tracked = state.instances.values().find(|t| {
            t.record.ended.is_none()
                && t.record.instance.tags.get(tags::NODECLAIM).map(String::as_str) == Some(name)
        })?;
        let instance = &tracked.record.instance;
        let it = instance_types
            .iter()
            .find(|it| it.name == instance.instance_type)?;
        Some(Launch {
            instance: instance.clone(),
            capacity: it.capacity.clone(),
            allocatable: it.allocatable(),
            labels: tracked.labels.clone(),
            unavailable: Vec::new(),
        })
    }

    /// Terminates a running instance; `NodeClaimNotFound` when it is not running.
    async fn terminate(&self, provider_id: &str) -> Result<(), CloudError> {
        self.adopting_instance(provider_id, || self.with_running(provider_id, |_| ()).ok())
            .await?
            .ok_or_else(|| not_found(provider_id))?;
        let id = instance_id(provider_id);
        let reason = if self.inner.books.was_warned(id) {
            EndReason::SpotInterruption
        } else {
            EndReason::Terminated
        };
        self.end(id, reason).await;
        Ok(())
    }

    /// A running instance; `NodeClaimNotFound` when it is not running.
    fn describe(&self, provider_id: &str) -> Result<Instance, CloudError> {
        self.with_running(provider_id, |t| t.record.instance.clone())
    }

    /// `act` on a running instance; `NodeClaimNotFound` when it is not running.
    fn with_running<R>(
        &self,
        provider_id: &str,
        act: impl FnOnce(&mut Tracked) -> R,
    ) -> Result<R, CloudError> {
        self.inner
            .books
            .lock()
            .instances
            .get_mut(instance_id(provider_id))
            .filter(|t| t.record.ended.is_none())
            .map(act)
            .ok_or_else(|| not_found(provider_id))
    }

    /// On KWOK, takes into the books the instances launched elsewhere (by another replica, or by
    /// this controller before it restarted), read back from their Nodes, and ends those whose Node
    /// existed before the listing and is gone from it: another controller terminated them (an
    /// instance is its Node there). Lookups that miss together share one listing ([`listings`]).
    /// Elsewhere nothing.
    async fn adopt(&self) -> Result<(), CloudError> {
        if self.inner.kubelet != Kubelet::Kwok {
            return Ok(());
        }
        self.inner.listings.shared(|| self.read_back()).await
    }

    /// One reading of the KWOK Nodes for [`Self::adopt`].
    async fn read_back(&self) -> Result<(), CloudError> {
        // Taken before the listing, so a Node registered while it is read is not taken for gone.
        let registered = self.inner.books.registered();
        let mut present = BTreeSet::new();
        for mut listed in kwok::listed(&self.inner.client).await? {
            if listed.instance.price <= 0.0 {
                listed.instance.price = self.price(&listed.instance).unwrap_or_default();
            }
            present.insert(instance_id(&listed.instance.provider_id).to_owned());
            self.inner
                .books
                .adopt(listed.instance, listed.node_name, listed.labels);
        }
        // Their Nodes are gone already: deleting one by its name again could remove a Node
        // registered since under that name.
        for gone in registered.difference(&present) {
            tracing::info!(
                instance = gone,
                "an instance whose node is gone was ended elsewhere"
            );
            self.release(gone, EndReason::Terminated);
        }
        Ok(())
    }

    /// The hourly price of the offering `instance` was bought from, if the cloud sells it.
    fn price(&self, instance: &Instance) -> Option<f64> {
        let (_, it) = self
            .inner
            .types
            .iter()
            .find(|(_, it)| it.name == instance.instance_type)?;
        it.offerings
            .iter()
            .find(|o| o.zone == instance.zone && o.capacity_type == instance.capacity_type)
            .map(|o| o.price)
    }

    /// `look` in the books; on a miss, again after [`Self::adopt`].
    async fn adopting<R>(&self, look: impl Fn() -> Option<R>) -> Result<Option<R>, CloudError> {
        if let Some(found) = look() {
            return Ok(Some(found));
        }
        self.adopt().await?;
        Ok(look())
    }

    /// [`Self::adopting`] for a lookup of the instance `provider_id`, which reads nothing back when
    /// the books know the instance already: adopting never replaces what they hold, so one they
    /// know has ended stays ended.
    async fn adopting_instance<R>(
        &self,
        provider_id: &str,
        look: impl Fn() -> Option<R>,
    ) -> Result<Option<R>, CloudError> {
        if self.inner.books.knows(instance_id(provider_id)) {
            return Ok(look());
        }
        self.adopting(look).await
    }
}

/// The KWOK cloud's interruption queue: the simulated queue, with a spot interruption for every KWOK
/// node annotated [`kwok::INTERRUPT_ANNOTATION`], looked for every [`KWOK_SCAN`] of a receive's long
/// poll, so interruptions can be sent from outside the controller. Only the leader receives, so
/// only the leader interrupts.
#[derive(Clone)]
pub struct KwokQueue {
    cloud: SimCloud,
}

/// How often a receive looks for nodes to interrupt.
const KWOK_SCAN: Duration = Duration::from_secs(2);

impl KwokQueue {
    /// The queue of `cloud`.
    pub fn new(cloud: SimCloud) -> Self {
        Self { cloud }
    }
}

impl std::fmt::Debug for KwokQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KwokQueue")
    }
}

impl InterruptionQueue for KwokQueue {
    fn receive(&self) -> CloudFuture<'_, Vec<QueueMessage>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + queue::LONG_POLL;
            loop {
                self.cloud.interrupt_annotated().await?;
                let taken = self.cloud.inner.queue.take()?;
                if !taken.is_empty() || tokio::time::Instant::now() >= deadline {
                    return Ok(taken);
                }
                tokio::time::sleep(KWOK_SCAN).await;
            }
        })
    }

    fn delete<'a>(&'a self, receipt: &'a str) -> CloudFuture<'a, ()> {
        self.cloud.inner.queue.delete(receipt)
    }
}

/// The error for a provider ID the cloud runs no instance of.
fn not_found(provider_id: &str) -> CloudError {
    CloudError::NodeClaimNotFound {
        provider_id: provider_id.to_owned(),
    }
}

/// The prefix of a region's zone IDs, as AWS writes them: `us-west-2` → `usw2`, `ap-northeast-1` →
/// `apne1`.
fn zone_id_prefix(region: &str) -> String {
    let mut parts = region.split('-');
    let mut prefix = parts.next().unwrap_or_default().to_owned();
    for part in parts {
        let mut rest = part;
        while !rest.is_empty() {
            let word = ["north", "south", "east", "west", "central"]
                .into_iter()
                .find(|w| rest.starts_with(w));
            match word {
                Some(word) => {
                    prefix.push_str(&word[..1]);
                    rest = &rest[word.len()..];
                }
                None => {
                    prefix.push_str(rest);
                    rest = "";
                }
            }
        }
    }
    prefix
}

/// `node` as a kubelet that cannot start its container network writes it: `Ready=False` from the
/// start, which kubesim's kubelet takes for broken and never heals.
fn never_ready(mut node: Node) -> Node {
    let condition = k8s_openapi::api::core::v1::NodeCondition {
        type_: "Ready".to_owned(),
        status: "False".to_owned(),
        reason: Some("KubeletNotReady".to_owned()),
        message: Some("container runtime network not ready (injected fault)".to_owned()),
        ..k8s_openapi::api::core::v1::NodeCondition::default()
    };
    node.status.get_or_insert_default().conditions = Some(vec![condition]);
    node
}

/// An instance on its way to registering its Node.
struct Booting {
    client: kube::Client,
    books: Books,
    instance_id: String,
}

impl Booting {
    /// Waits for the instance to boot, registers its Node, and lets the books drop the handle of
    /// this task: a finished task's memory stays allocated while its handle is kept (some 5 KB an
    /// instance, 50 MB at 10,000 nodes).
    async fn register(self, node: Node, boot: Duration) {
        tokio::time::sleep(boot).await;
        let nodes: Api<Node> = Api::all(self.client);
        let created = nodes.create(&PostParams::default(), &node).await;
        if let Err(error) = &created {
            tracing::warn!(node = node.metadata.name.as_deref().unwrap_or_default(), %error, "node registration failed");
        }
        self.books.booted(&self.instance_id, created.is_ok());
    }
}

/// EC2's words for a launch `group`'s rule refused.
fn refusal_message(group: &PlacementGroup, refused: Refusal) -> String {
    match refused {
        Refusal::SpreadLimit => placement_group::spread_limit_message(group),
        Refusal::OtherZone { zone } => format!(
            "InsufficientInstanceCapacity: cluster placement group {} runs in {zone}",
            group.name
        ),
    }
}

impl CloudProvider for SimCloud {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn create<'a>(
        &'a self,
        claim: &'a NodeClaim,
        node_class: Option<&'a EC2NodeClass>,
        instance_types: &'a [Arc<InstanceType>],
    ) -> CloudFuture<'a, Launch> {
        Box::pin(async move {
            let reply = self.inner.books.call(Operation::Create)?;
            let (node_class, _) =
                joist_provider::node_class::launchable(&claim.spec.node_class_ref.name, node_class)?;
            let group = placement_group::required(node_class, self.placement_group(node_class).await?)?;
            let launched = self.launch(claim, (node_class, group.as_ref()), instance_types);
            reply.answer(launched).await
        })
    }

    fn find_launch<'a>(
        &'a self,
        claim: &'a NodeClaim,
        instance_types: &'a [Arc<InstanceType>],
    ) -> CloudFuture<'a, Option<Launch>> {
        Box::pin(async move {
            let reply = self.inner.books.call(Operation::List)?;
            let name = claim.name_any();
            let found = self.adopting(|| self.find_tagged(&name, instance_types)).await;
            reply.answer(found).await
        })
    }

    fn delete<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(async move {
            let reply = self.inner.books.call(Operation::Delete)?;
            reply.answer(self.terminate(provider_id).await).await
        })
    }

    fn get<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, Instance> {
        Box::pin(async move {
            let reply = self.inner.books.call(Operation::Get)?;
            let found = self
                .adopting_instance(provider_id, || self.describe(provider_id).ok())
                .await
                .and_then(|found| found.ok_or_else(|| not_found(provider_id)));
            reply.answer(found).await
        })
    }

    fn list(&self) -> CloudFuture<'_, Vec<Instance>> {
        Box::pin(async move {
            let reply = self.inner.books.call(Operation::List)?;
            if let Err(error) = self.adopt().await {
                return reply.answer(Err(error)).await;
            }
            let running = self
                .inner
                .books
                .lock()
                .instances
                .values()
                .filter(|t| t.record.ended.is_none())
                .map(|t| t.record.instance.clone())
                .collect();
            reply.answer(Ok(running)).await
        })
    }
    fn instance_types<'a>(
        &'a self,
        _node_pool: &'a NodePool,
        node_class: &'a EC2NodeClass,
    ) -> CloudFuture<'a, Vec<InstanceType>> {
        Box::pin(async move {
            let group = placement_group::required(node_class, self.placement_group(node_class).await?)?;
            let zones: Vec<&str> = node_class
                .status
                .iter()
                .flat_map(|s| &s.subnets)
                .map(|s| s.zone.as_str())
                .collect();
            let interfaces = &node_class.spec.network_interfaces;
            Ok(self
                .inner
                .types
                .iter()
                .filter(|(shape, _)| {
                    shape
                        .as_ref()
                        .map_or(interfaces.is_empty(), |shape| shape.supports(interfaces))
                })
                .map(|(_, it)| {
                    let mut it = it.clone();
                    it.offerings.retain(|o| zones.contains(&o.zone.as_str()));
                    if let Some(status) = &node_class.status {
                        let on_demand = it
                            .offerings
                            .iter()
                            .find(|o| o.capacity_type == CapacityType::OnDemand)
                            .map(|o| o.price);
                        let offered: Vec<&str> = it.offerings.iter().map(|o| o.zone.as_str()).collect();
                        it.add_offerings(capacity_reservation::reserved_offerings(
                            &it.name,
                            on_demand,
                            &offered,
                            status,
                            &self.inner.reservation_room,
                        ));
                    }
                    it
                })
                .filter(|it| !it.offerings.is_empty())
                .collect::<Vec<_>>())
            .map(|mut types| {
                placement_group::constrain(&mut types, group.as_ref());
                types
            })
        })
    }

    fn resolve_node_class<'a>(&'a self, node_class: &'a EC2NodeClass) -> CloudFuture<'a, EC2NodeClassStatus> {
        Box::pin(async move {
            let reply = self.inner.books.call(Operation::ResolveNodeClass)?;
            let settings = &self.inner.settings;
            let name = node_class.metadata.name.as_deref().unwrap_or_default();
            let zones: Vec<String> = if settings.zones.is_empty() {
                let mut all: Vec<String> = self
                    .inner
                    .types
                    .iter()
                    .flat_map(|(_, it)| it.offerings.iter().map(|o| o.zone.clone()))
                    .collect();
                all.sort();
                all.dedup();
                all
            } else {
                settings.zones.clone()
            };
            let subnets = zones
                .iter()
                .enumerate()
                .map(|(i, zone)| ResolvedSubnet {
                    id: format!("subnet-0sim{i:013}"),
                    zone: zone.clone(),
                    zone_id: Some(format!("{}-az{}", zone_id_prefix(&settings.region), i + 1)),
                })
                .collect();
            let image = self.image_for(node_class);
            let amis = ["amd64", "arm64"]
                .into_iter()
                .map(|arch| ResolvedAmi {
                    id: image.clone(),
                    name: Some(format!("sim-eks-node-{arch}")),
                    deprecated: false,
                    requirements: vec![
                        joist_messages::apis::common::NodeSelectorRequirementWithMinValues {
                            key: ARCH.to_owned(),
                            operator: joist_messages::model::requirements::Operator::In,
                            values: vec![arch.to_owned()],
                            min_values: None,
                        },
                    ],
                })
                .collect();
            let status = EC2NodeClassStatus {
                subnets,
                security_groups: vec![ResolvedSecurityGroup {
                    id: "sg-0sim00000000000000".to_owned(),
                    name: Some(format!("{}-node", settings.cluster_name)),
                }],
                amis,
                instance_profile: Some(format!("{}_{name}", settings.cluster_name)),
                capacity_reservations: self.described_reservations(node_class),
                conditions: Vec::new(),
            };
            reply.answer(Ok(status)).await
        })
    }

    fn name_instance<'a>(&'a self, provider_id: &'a str, node_name: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(async move {
            let reply = self.inner.books.call(Operation::NameInstance)?;
            let named = self.with_running(provider_id, |t| {
                t.record
                    .instance
                    .tags
                    .insert("Name".to_owned(), node_name.to_owned());
            });
            reply.answer(named).await
        })
    }

    fn resolve_placement_group<'a>(
        &'a self,
        node_class: &'a EC2NodeClass,
    ) -> CloudFuture<'a, Option<PlacementGroup>> {
        Box::pin(async move {
            let describe = |selector: PlacementGroupSelector| async move {
                // A DescribePlacementGroups call, when there is a selector to ask about.
                let reply = self.inner.books.call(Operation::ResolveNodeClass)?;
                let described = self.placement_groups().describe(&selector);
                reply.answer(Ok(described)).await
            };
            (self.inner.resolved_groups).refresh(node_class, describe).await
        })
    }

    fn is_drifted<'a>(
        &'a self,
        claim: &'a NodeClaim,
        node_class: &'a EC2NodeClass,
    ) -> CloudFuture<'a, Option<Drift>> {
        Box::pin(async move {
            let (Some(provider_id), Some(status)) = (
                claim.status.as_ref().and_then(|s| s.provider_id.as_deref()),
                node_class.status.as_ref(),
            ) else {
                return Ok(None);
            };
            let instance = self.get(provider_id).await?;
            if instance.image_id.is_empty() {
                // Launched by Karpenter's KWOK provider, which records no image and reports no
                // drift of its own.
                return Ok(None);
            }
            // Simulated instances carry no security groups; their subnet is their zone's.
            let in_zone = |subnet: &ResolvedSubnet| subnet.zone == instance.zone;
            let drift = joist_provider::node_class::drift(
                status,
                &instance.image_id,
                in_zone,
                None,
                instance.reservation.as_ref().map(|r| r.id.as_str()),
            );
            match drift {
                Some(drift) => Ok(Some(drift)),
                None => {
                    let group = self.placement_group(node_class).await?;
                    Ok(placement_group::drift(claim, group.as_ref()))
                }
            }
        })
    }

    /// The simulated cloud is EC2: a scenario's `nodeCondition` step breaks nodes the way EC2's do.
    fn repair_policies(&self) -> &'static [RepairPolicy] {
        EC2_REPAIR_POLICIES
    }

    /// A scenario's `impairInstances` step makes the checks fail (see [`SimCloud::impair`]).
    fn reserved_capacity(&self) -> HashMap<String, u32> {
        self.inner.reservation_room.counts_now()
    }

    fn reservation_reclaimed(&self, id: &str) {
        self.inner.reservation_room.exhausted(id);
    }

    fn impaired_instances(&self) -> CloudFuture<'_, Vec<InstanceHealth>> {
        Box::pin(async move {
            let reply = self.inner.books.call(Operation::DescribeInstanceStatus)?;
            reply.answer(Ok(self.inner.books.impaired())).await
        })
    }
}

/// The id of a family's image of a generation (`ami-0simal2023000000` for the first `al2023`).
fn image_id(family: &str, generation: u32) -> String {
    format!("ami-0sim{family}{generation:06}")
}

#[cfg(test)]
mod tests {
    use super::zone_id_prefix;

    #[test]
    fn zone_ids_are_named_as_aws_names_them() {
        assert_eq!(zone_id_prefix("us-west-2"), "usw2");
        assert_eq!(zone_id_prefix("us-east-1"), "use1");
        assert_eq!(zone_id_prefix("ap-northeast-1"), "apne1");
        assert_eq!(zone_id_prefix("eu-central-1"), "euc1");
    }
}
