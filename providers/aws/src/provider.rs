//! [`AwsCloud`]: the [`CloudProvider`] that runs on EKS, joining the parts of this crate.
//!
//! - `instance_types`: the catalog read from EC2 (kept for [`CATALOG_REFRESH`], the last known one
//!   kept when a refresh fails) priced with the last known prices ([`crate::offerings`]): the
//!   built-in table at first, then what the Price List API and EC2's spot price history answer,
//!   refreshed every [`PRICING_REFRESH`] (after a failure, in [`PRICING_RETRY`]).
//! - `create`: reads the claim's EC2NodeClass (missing or not Ready: `NodeClassNotReady`), picks
//!   the offerings ([`joist_provider::launch::candidates`]), an image per type, a launch template per
//!   image and pod capacity (the user data carries `maxPods`), the subnet with the most free
//!   addresses per zone, and sends one CreateFleet, coalesced with identical requests
//!   ([`crate::coalesce`]). The instance is then tagged with its NodeClaim's name.
//! - `delete`: TerminateInstances, coalesced; `get` and `list`: DescribeInstances by id (coalesced)
//!   or by the cluster's tags ([`crate::instances`]).
//! - `resolve_node_class`: [`crate::node_class::resolve`] for the cluster's Kubernetes version.
//! - `is_drifted`: the instance's image, subnet and security groups (a coalesced DescribeInstances)
//!   against the class's status, then its placement group against the class's.
//! - Placement groups ([`joist_provider::placement_group`]): the class's group is described
//!   ([`crate::placement_groups`]) when first needed and with every resolution of the class; its
//!   types carry its id (and partitions), its launch templates place instances in it by id (and
//!   in the partition a claim asks for), and a partition group's node is labelled with the
//!   partition EC2 chose, read back after the launch.
//!
//! Failures map to [`CloudError`]: throttling and faults are `Transient`; capacity errors are
//! `InsufficientCapacity` with the offerings for the unavailable-offering cache; a user data that
//! cannot be rendered or a request EC2 refuses is a `Create` error naming the class or EC2's code.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, PoisonError, RwLock},
    time::Duration,
};

use futures::FutureExt;
use joist_messages::{
    apis::{EC2NodeClass, EC2NodeClassStatus, NodeClaim, NodePool, ec2nodeclass::PlacementGroupSelector},
    labels::{annotations::PRICE_OVERLAY_APPLIED, tags::NODECLAIM as NODECLAIM_TAG},
    model::{
        instance_type::{CapacityType, InstanceType},
        resources::names,
        shape::CapacitySettings,
    },
};
use joist_provider::{
    CloudError, CloudFuture, CloudProvider, Drift, Instance, InstanceState, Launch, OfferingKey,
    capacity_reservation,
    instance_status::InstanceHealth,
    launch,
    placement_group::{self, PlacementGroup, Strategy},
    repair::{EC2_REPAIR_POLICIES, RepairPolicy},
};
use k8s_openapi::api::core::v1::Taint;
use kube::ResourceExt;
use tokio::{sync::Mutex, time::Instant};

use crate::{
    catalog,
    clients::AwsClients,
    coalesce::{Coalescer, Window},
    fleet::{self, FleetRequest, Launched, Override, TemplateConfig},
    instance_status, instances,
    launch_template::{self, LaunchTemplates, PlacementTarget, ReservationTarget, TemplateInput},
    node_class,
    offerings::{self, Catalog},
    placement_groups,
    price_source::SdkPriceSource,
    pricing::{self, PRICING_REFRESH, PriceSource, Prices},
    user_data::{self, Bootstrap},
};

/// How long after a failed price refresh the next one is tried.
pub const PRICING_RETRY: Duration = Duration::from_secs(10 * 60);
/// How long the catalog read from EC2 is used before it is read again.
pub const CATALOG_REFRESH: Duration = Duration::from_secs(12 * 60 * 60);
/// How many times a just-launched instance of a partition group is read for its partition.
const PARTITION_READS: u32 = 3;
/// The wait between two such reads.
const PARTITION_READ_INTERVAL: Duration = Duration::from_secs(1);
/// The taint every node registers with until Joist sees it.
const UNREGISTERED_TAINT: &str = "karpenter.sh/unregistered";

/// The cluster facts and controller settings the AWS provider needs.
#[derive(Debug, Clone)]
pub struct AwsSettings {
    /// `CLUSTER_NAME`.
    pub cluster_name: String,
    /// `CLUSTER_ENDPOINT`.
    pub cluster_endpoint: String,
    /// `CLUSTER_CA_BUNDLE`.
    pub cluster_ca_bundle: Option<String>,
    /// The service CIDR (AL2023 nodes need it).
    pub cluster_cidr: Option<String>,
    /// The cluster's Kubernetes version (`1.35`), for AMI aliases.
    pub kubernetes_version: String,
    /// VM memory overhead and reserved ENIs.
    pub capacity: CapacitySettings,
    /// `ISOLATED_VPC`: the Price List API cannot be reached.
    pub isolated_vpc: bool,
    /// Karpenter's `ReservedCapacity` feature gate: capacity reservations are described and
    /// launched into, and other launches kept out of open ones. Off, launch templates say nothing
    /// of reservations (EC2's default: any open reservation that matches).
    pub reserved_capacity: bool,
}

/// Why the provider could not start.
#[derive(Debug, thiserror::Error)]
pub enum AwsCloudError {
    /// The built-in price table does not parse.
    #[error(transparent)]
    Prices(#[from] joist_provider::prices::PriceTableError),
}

/// The AWS cloud provider (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct AwsCloud {
    inner: Arc<Inner>,
}

type FleetResult = Result<(Launched, Vec<OfferingKey>), CloudError>;

/// The least time between two CreateTags calls that name instances after their Nodes.
pub const CREATE_TAGS_INTERVAL: Duration = Duration::from_secs(1);

struct Inner {
    clients: AwsClients,
    settings: AwsSettings,
    catalog: Mutex<Option<(Instant, Arc<Catalog>)>>,
    prices: RwLock<Prices>,
    templates: LaunchTemplates,
    fleets: Coalescer<FleetRequest, (), FleetResult>,
    terminations: Coalescer<(), String, Result<(), CloudError>>,
    lookups: instances::Lookups,
    /// When the next CreateTags call for a Node name may go out.
    next_create_tags: Mutex<Instant>,
    /// The room in each capacity reservation, as last described and counted since.
    reservation_room: capacity_reservation::Availability,
    /// The placement group each class resolved to.
    placement_groups: placement_group::Resolved,
}

impl AwsCloud {
    /// A provider for the cluster `settings` describe. It starts refreshing prices at once and every [`PRICING_REFRESH`] after (on the current tokio
    /// runtime, until the provider is dropped).
    pub fn new(clients: AwsClients, settings: AwsSettings) -> Result<Self, AwsCloudError> {
        let built_in = joist_provider::prices::PriceTable::built_in()?.region(&clients.region);
        let fleet_clients = clients.clone();
        let fleets = Coalescer::new(
            Window::CREATE_FLEET,
            Arc::new(move |request: FleetRequest, items: Vec<()>| {
                let clients = fleet_clients.clone();
                async move {
                    match fleet::create(&clients, &request, items.len()).await {
                        Ok(outcome) => outcome.into_results(items.len()),
                        Err(error) => {
                            let error = CloudError::from(error);
                            items.iter().map(|()| Err(error.clone())).collect()
                        }
                    }
                }
                .boxed()
            }),
        );
        let terminate_clients = clients.clone();
        let terminations = Coalescer::new(
            Window::TERMINATE,
            Arc::new(move |(), ids: Vec<String>| {
                let clients = terminate_clients.clone();
                async move { instances::terminate_all(&clients, &ids).await }.boxed()
            }),
        );
        let lookups = instances::lookups(clients.clone());
        let source = SdkPriceSource::new(clients.clone(), settings.isolated_vpc);
        let inner = Arc::new(Inner {
            clients,
            settings,
            catalog: Mutex::new(None),
            prices: RwLock::new(Prices::new(built_in)),
            templates: LaunchTemplates::default(),
            fleets,
            terminations,
            lookups,
            next_create_tags: Mutex::new(Instant::now()),
            reservation_room: capacity_reservation::Availability::default(),
            placement_groups: placement_group::Resolved::default(),
        });
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            while let Some(inner) = weak.upgrade() {
                let wait = AwsCloud { inner }.refresh_prices(&source).await;
                tokio::time::sleep(wait).await;
            }
        });
        Ok(Self { inner })
    }

    /// Fetches fresh prices from `source` into the table; how long until the next refresh.
    async fn refresh_prices(&self, source: &dyn PriceSource) -> Duration {
        let zones: Vec<String> = match self.catalog().await {
            Ok(catalog) => {
                let all: BTreeSet<&String> = catalog.zones.values().flatten().collect();
                all.into_iter().cloned().collect()
            }
            Err(error) => {
                tracing::warn!(%error, "cannot refresh prices without the catalog's zones");
                return PRICING_RETRY;
            }
        };
        // Only this task writes prices, so refreshing a copy loses nothing.
        let mut prices = self
            .inner
            .prices
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let now = joist_messages::time::Clock::system().now_seconds();
        let errors = pricing::refresh(&mut prices, source, &self.inner.clients.region, &zones, now).await;
        *self.inner.prices.write().unwrap_or_else(PoisonError::into_inner) = prices;
        for error in &errors {
            tracing::warn!(%error, "price refresh incomplete; keeping the last known prices");
        }
        if errors.is_empty() {
            tracing::info!("refreshed on-demand and spot prices");
            PRICING_REFRESH
        } else {
            PRICING_RETRY
        }
    }

    /// The catalog, read again when older than [`CATALOG_REFRESH`]; the last known one when that
    /// read fails.
    async fn catalog(&self) -> Result<Arc<Catalog>, CloudError> {
        let mut cached = self.inner.catalog.lock().await;
        if let Some((read_at, catalog)) = cached.as_ref()
            && read_at.elapsed() < CATALOG_REFRESH
        {
            return Ok(catalog.clone());
        }
        let ec2 = &self.inner.clients.ec2;
        match tokio::try_join!(catalog::shapes(ec2), catalog::zones(ec2)) {
            Ok((shapes, zones)) => {
                let catalog = Arc::new(Catalog { shapes, zones });
                tracing::info!(
                    instance_types = catalog.shapes.len(),
                    "read the instance-type catalog"
                );
                *cached = Some((Instant::now(), catalog.clone()));
                Ok(catalog)
            }
            Err(error) => match cached.as_ref() {
                Some((_, catalog)) => {
                    tracing::warn!(%error, "reading the instance-type catalog failed; keeping the last one");
                    Ok(catalog.clone())
                }
                None => Err(error.into()),
            },
        }
    }

    /// The placement group `class` launches into (described the first time it is asked for).
    async fn placement_group(&self, class: &EC2NodeClass) -> Result<Option<PlacementGroup>, CloudError> {
        let clients = &self.inner.clients;
        (self.inner.placement_groups)
            .group(class, |selector| describe_placement_group(clients, selector))
            .await
    }

    /// The launch template for nodes of `class` booting `image_id` with `max_pods` pods.
    fn template_input(
        &self,
        class: &EC2NodeClass,
        claim: &NodeClaim,
        (image_id, max_pods): (&str, Option<u32>),
        (capacity_reservation, placement): (ReservationTarget, Option<PlacementTarget>),
    ) -> Result<TemplateInput, CloudError> {
        let settings = &self.inner.settings;
        let class_name = class.name_any();
        let status = class.status.as_ref();
        let family = class.spec.user_data_family();
        let mut taints: Vec<Taint> = claim.spec.taints.clone();
        taints.extend(claim.spec.startup_taints.iter().cloned());
        if !taints.iter().any(|t| t.key == UNREGISTERED_TAINT) {
            taints.push(Taint {
                key: UNREGISTERED_TAINT.to_owned(),
                effect: "NoExecute".to_owned(),
                ..Taint::default()
            });
        }
        let user_data = user_data::render(
            family,
            &Bootstrap {
                cluster_name: &settings.cluster_name,
                cluster_endpoint: &settings.cluster_endpoint,
                ca_bundle: settings.cluster_ca_bundle.as_deref(),
                cluster_cidr: settings.cluster_cidr.as_deref(),
                labels: claim.labels(),
                taints: &taints,
                max_pods,
                kubelet: class.spec.kubelet.as_ref(),
                instance_store_policy: class.spec.instance_store_policy,
                custom: class.spec.user_data.as_deref(),
            },
        )
        .map_err(|e| CloudError::Create {
            reason: "UserData".to_owned(),
            message: format!("ec2nodeclass {class_name:?}: {e}"),
        })?;
        let instance_profile =
            status
                .and_then(|s| s.instance_profile.clone())
                .ok_or_else(|| CloudError::NodeClassNotReady {
                    node_class: class_name.clone(),
                    reason: "status.instanceProfile is not resolved".to_owned(),
                })?;
        let mut tags = class.spec.tags.clone();
        tags.insert(
            launch_template::CLUSTER_TAG.to_owned(),
            settings.cluster_name.clone(),
        );
        Ok(TemplateInput {
            capacity_reservation,
            placement,
            image_id: image_id.to_owned(),
            user_data,
            security_group_ids: status
                .iter()
                .flat_map(|s| &s.security_groups)
                .map(|g| g.id.clone())
                .collect(),
            instance_profile,
            metadata: class.spec.metadata_options.clone(),
            block_devices: offerings::block_devices(class, family),
            detailed_monitoring: class.spec.detailed_monitoring.unwrap_or(false),
            associate_public_ip: class.spec.associate_public_ip_address,
            network_interfaces: class.spec.network_interfaces.clone(),
            ip_prefix_count: class.spec.ip_prefix_count,
            connection_tracking: class.spec.connection_tracking.clone(),
            nested_virtualization: class
                .spec
                .cpu_options
                .as_ref()
                .and_then(|c| c.nested_virtualization),
            tags,
        })
    }

    async fn launch(
        &self,
        claim: &NodeClaim,
        node_class: Option<&EC2NodeClass>,
        instance_types: &[Arc<InstanceType>],
    ) -> Result<Launch, CloudError> {
        let (class, status) =
            joist_provider::node_class::launchable(&claim.spec.node_class_ref.name, node_class)?;
        let group = placement_group::required(class, self.placement_group(class).await?)?;
        let requested_partition = placement_group::requested_partition(&launch::claim_requirements(claim)?);
        let placement = group.as_ref().map(|g| PlacementTarget {
            group_id: g.id.clone(),
            partition: requested_partition.filter(|_| matches!(g.strategy, Strategy::Partition { .. })),
        });
        let candidates = launch::candidates(claim, instance_types)?;
        // `candidates` answers an error rather than nothing, so there is a first.
        let Some(capacity_type) = candidates.first().map(|c| c.offering.capacity_type) else {
            return Err(CloudError::InsufficientCapacity {
                offerings: Vec::new(),
                message: "no offering to launch".to_owned(),
            });
        };
        let subnets = node_class::zonal_subnets(&self.inner.clients, &status.subnets).await?;
        let amis = offerings::ami_requirements(&status.amis);
        let mut templates: HashMap<(String, Option<u32>, ReservationTarget), String> = HashMap::new();
        let mut configs: Vec<TemplateConfig> = Vec::new();
        for (rank, candidate) in candidates.iter().enumerate() {
            let (Some(subnet), Some(ami)) = (
                subnets.get(&candidate.offering.zone),
                offerings::ami_for(&amis, candidate.instance_type),
            ) else {
                continue;
            };
            let max_pods = u32::try_from(candidate.instance_type.capacity.get(names::PODS).units_ceil()).ok();
            // One template per reservation, as each targets its own.
            let target = match &candidate.offering.reservation {
                Some(offered) => ReservationTarget::Only {
                    id: offered.reservation.id.clone(),
                    kind: offered.reservation.kind,
                    interruptible: offered.reservation.interruptible,
                },
                None if self.inner.settings.reserved_capacity => ReservationTarget::None,
                None => ReservationTarget::Unspecified,
            };
            let key = (ami.id.clone(), max_pods, target);
            let template = match templates.get(&key) {
                Some(name) => name.clone(),
                None => {
                    let input = self.template_input(
                        class,
                        claim,
                        (&ami.id, max_pods),
                        (key.2.clone(), placement.clone()),
                    )?;
                    let name = self.inner.templates.ensure(&self.inner.clients, &input).await?;
                    templates.insert(key, name.clone());
                    name
                }
            };
            let index = match configs.iter().position(|c| c.template == template) {
                Some(index) => index,
                None => {
                    configs.push(TemplateConfig {
                        template,
                        overrides: Vec::new(),
                    });
                    configs.len() - 1
                }
            };
            configs[index].overrides.push(Override {
                instance_type: candidate.instance_type.name.clone(),
                subnet_id: subnet.clone(),
                zone: candidate.offering.zone.clone(),
                priority: u32::try_from(rank).unwrap_or(u32::MAX),
            });
        }
        if configs.is_empty() {
            return Err(CloudError::NodeClassNotReady {
                node_class: class.name_any(),
                reason: "no subnet or image serves any offering the claim allows".to_owned(),
            });
        }
        let reservation = candidates
            .first()
            .and_then(|c| c.offering.reservation.as_ref())
            .map(|offered| (offered.reservation.kind, offered.reservation.interruptible));
        let request = FleetRequest {
            capacity_type,
            reservation,
            prioritized: claim
                .annotations()
                .get(PRICE_OVERLAY_APPLIED)
                .is_some_and(|v| v == "true"),
            placement_group: group.as_ref().map(|g| g.id.clone()),
            configs,
            tags: joist_provider::launch::instance_tags(&self.inner.settings.cluster_name, class, claim),
        };
        let (launched, mut unavailable) = self
            .inner
            .fleets
            .submit(request.clone(), ())
            .await
            .unwrap_or_else(|| Err(instances::abandoned("CreateFleet")))
            .inspect_err(|error| {
                if let CloudError::Create { reason, .. } = error
                    && reason.starts_with("InvalidLaunchTemplateName")
                {
                    request
                        .configs
                        .iter()
                        .for_each(|c| self.inner.templates.forget(&c.template));
                }
            })
            .map_err(|mut error| {
                if let CloudError::InsufficientCapacity { offerings, .. } = &mut error {
                    self.exhaust_reservations(&candidates, offerings);
                }
                error
            })?;
        self.exhaust_reservations(&candidates, &mut unavailable);
        let claim_name = claim.name_any();
        instances::tag(
            &self.inner.clients,
            &launched.instance_id,
            &[(NODECLAIM_TAG, &claim_name), ("Name", &claim_name)],
        )
        .await
        .unwrap_or_else(|error| tracing::warn!(%error, instance = %launched.instance_id, "tagging failed"));
        let offering = &launched.offering;
        let instance_type = instance_types
            .iter()
            .find(|it| it.name == offering.instance_type)
            .ok_or_else(|| CloudError::Create {
                reason: "UnknownInstanceType".to_owned(),
                message: format!(
                    "CreateFleet launched {}, which the claim did not allow",
                    offering.instance_type
                ),
            })?;
        // The offering the fleet was asked for (one reservation per type and zone among them).
        let bought = candidates
            .iter()
            .find(|c| c.key() == *offering)
            .map(|c| c.offering)
            .or_else(|| {
                instance_type
                    .offerings
                    .iter()
                    .find(|o| o.zone == offering.zone && o.capacity_type == offering.capacity_type)
            });
        let price = bought.map_or(0.0, |o| o.price);
        let reservation = bought
            .and_then(|o| o.reservation.as_ref())
            .map(|r| r.reservation.clone());
        let image_id = offerings::ami_for(&amis, instance_type)
            .map(|a| a.id.clone())
            .unwrap_or_default();
        let mut labels = launch::node_labels(
            instance_type,
            &self.inner.clients.region,
            &offering.zone,
            offering.capacity_type.label(),
            class,
        );
        labels.extend(claim.labels().iter().map(|(k, v)| (k.clone(), v.clone())));
        if let Some(reservation) = &reservation {
            labels.extend(reservation.labels().map(|(k, v)| (k.to_owned(), v)));
            self.inner.reservation_room.launched(&reservation.id);
        }
        let provider_id = instances::provider_id(&offering.zone, &launched.instance_id);
        if let Some(group) = &group {
            let partition = match (group.strategy, requested_partition) {
                (Strategy::Partition { .. }, None) => self.partition_of(&provider_id).await,
                _ => requested_partition,
            };
            labels.extend(group.labels(partition));
        }
        let mut tags = request.tags;
        tags.insert(NODECLAIM_TAG.to_owned(), claim_name);
        Ok(Launch {
            instance: Instance {
                provider_id,
                instance_type: instance_type.name.clone(),
                zone: offering.zone.clone(),
                capacity_type: offering.capacity_type,
                reservation,
                image_id,
                price,
                state: InstanceState::Pending,
                launched_at: joist_messages::time::Clock::system().now_seconds(),
                tags,
            },
            capacity: instance_type.capacity.clone(),
            allocatable: instance_type.allocatable(),
            labels,
            unavailable,
        })
    }

    /// The partition EC2 put a just-launched instance in, read back with DescribeInstances (a
    /// few tries, as a new instance may not be described at once); `None`, logged, when EC2 does
    /// not say: the node then carries no partition label.
    async fn partition_of(&self, provider_id: &str) -> Option<u32> {
        for attempt in 1..=PARTITION_READS {
            match instances::placement(&self.inner.lookups, provider_id).await {
                Ok(placement) if placement.partition.is_some() => return placement.partition,
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(provider_id, %error, attempt, "reading the instance's partition failed")
                }
            }
            tokio::time::sleep(PARTITION_READ_INTERVAL).await;
        }
        tracing::warn!(
            provider_id,
            "EC2 did not say which partition the instance is in; its node has no partition label"
        );
        None
    }

    /// Takes the reserved offerings out of `unavailable`: a reservation without room says nothing
    /// of its type's other offerings, so it is counted empty ([`capacity_reservation::Availability`])
    /// instead of going to the unavailable-offering cache.
    fn exhaust_reservations(&self, candidates: &[launch::Candidate<'_>], unavailable: &mut Vec<OfferingKey>) {
        unavailable.retain(|key| {
            if key.capacity_type != CapacityType::Reserved {
                return true;
            }
            candidates
                .iter()
                .filter(|c| c.key() == *key)
                .filter_map(|c| c.offering.reservation.as_ref())
                .for_each(|offered| self.inner.reservation_room.exhausted(&offered.reservation.id));
            false
        });
    }

    /// `instance` with the price of its offering filled in from the last known prices.
    fn priced(&self, mut instance: Instance) -> Instance {
        let prices = self.inner.prices.read().unwrap_or_else(PoisonError::into_inner);
        let price = match instance.capacity_type {
            CapacityType::Spot => prices.spot(&instance.instance_type, &instance.zone),
            CapacityType::Reserved => prices
                .on_demand(&instance.instance_type)
                .map(|price| price / capacity_reservation::RESERVED_PRICE_DIVISOR),
            CapacityType::OnDemand => prices.on_demand(&instance.instance_type),
        };
        instance.price = price.unwrap_or_default();
        instance
    }
}

impl CloudProvider for AwsCloud {
    fn name(&self) -> &'static str {
        "aws"
    }

    /// Not found on AWS: a fleet coalesces several claims, so their instances get the
    /// `karpenter.sh/nodeclaim` tag only from a `CreateTags` call after `CreateFleet` answered, and
    /// an instance whose reply was lost may not carry it. Such a claim launches again, and the
    /// garbage collector terminates the first instance, as Karpenter's does.
    fn find_launch<'a>(
        &'a self,
        _claim: &'a NodeClaim,
        _instance_types: &'a [Arc<InstanceType>],
    ) -> CloudFuture<'a, Option<Launch>> {
        Box::pin(async { Ok(None) })
    }

    fn create<'a>(
        &'a self,
        claim: &'a NodeClaim,
        node_class: Option<&'a EC2NodeClass>,
        instance_types: &'a [Arc<InstanceType>],
    ) -> CloudFuture<'a, Launch> {
        Box::pin(self.launch(claim, node_class, instance_types))
    }

    fn delete<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(instances::by_instance(
            &self.inner.terminations,
            "TerminateInstances",
            provider_id,
        ))
    }

    fn get<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, Instance> {
        Box::pin(async move {
            let instance = instances::get(&self.inner.lookups, provider_id).await?;
            Ok(self.priced(instance))
        })
    }

    fn list(&self) -> CloudFuture<'_, Vec<Instance>> {
        Box::pin(async move {
            let listed = instances::list(&self.inner.clients, &self.inner.settings.cluster_name).await?;
            Ok(listed.into_iter().map(|i| self.priced(i)).collect())
        })
    }

    fn instance_types<'a>(
        &'a self,
        _node_pool: &'a NodePool,
        node_class: &'a EC2NodeClass,
    ) -> CloudFuture<'a, Vec<InstanceType>> {
        Box::pin(async move {
            let group = placement_group::required(node_class, self.placement_group(node_class).await?)?;
            let catalog = self.catalog().await?;
            let family = node_class.spec.user_data_family();
            let settings = offerings::capacity_settings(node_class, family, self.inner.settings.capacity);
            let mut types = {
                let prices = self.inner.prices.read().unwrap_or_else(PoisonError::into_inner);
                offerings::instance_types(
                    &catalog,
                    &prices,
                    &self.inner.clients.region,
                    node_class,
                    (&settings, &self.inner.reservation_room),
                )
            };
            placement_group::constrain(&mut types, group.as_ref());
            Ok(types)
        })
    }

    fn resolve_node_class<'a>(&'a self, node_class: &'a EC2NodeClass) -> CloudFuture<'a, EC2NodeClassStatus> {
        Box::pin(async move {
            node_class::resolve(
                &self.inner.clients,
                node_class,
                (
                    &self.inner.settings.cluster_name,
                    &self.inner.settings.kubernetes_version,
                ),
                self.inner
                    .settings
                    .reserved_capacity
                    .then_some(&self.inner.reservation_room),
                joist_messages::time::Clock::system().now_seconds(),
            )
            .await
            .map_err(|error| match error {
                node_class::ResolveError::Api(api) => CloudError::from(api),
                other => CloudError::NodeClassNotReady {
                    node_class: node_class.name_any(),
                    reason: other.to_string(),
                },
            })
        })
    }

    fn name_instance<'a>(&'a self, provider_id: &'a str, node_name: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(async move {
            let not_found = || CloudError::NodeClaimNotFound {
                provider_id: provider_id.to_owned(),
            };
            let id = instances::instance_id(provider_id).ok_or_else(not_found)?;
            // CreateTags is rate limited account-wide: Joist spends at most one call a second.
            let slot = {
                let mut next = self.inner.next_create_tags.lock().await;
                let slot = (*next).max(Instant::now());
                *next = slot + CREATE_TAGS_INTERVAL;
                slot
            };
            tokio::time::sleep_until(slot).await;
            instances::tag(&self.inner.clients, id, &[("Name", node_name)])
                .await
                .map_err(|error| match error.code() {
                    Some(code) if code.starts_with("InvalidInstanceID") => not_found(),
                    _ => error.into(),
                })
        })
    }

    fn resolve_placement_group<'a>(
        &'a self,
        node_class: &'a EC2NodeClass,
    ) -> CloudFuture<'a, Option<PlacementGroup>> {
        let clients = &self.inner.clients;
        Box::pin(
            (self.inner.placement_groups)
                .refresh(node_class, |selector| describe_placement_group(clients, selector)),
        )
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
            let placement = instances::placement(&self.inner.lookups, provider_id).await?;
            if let Some(drift) = drift(&placement, status) {
                return Ok(Some(drift));
            }
            let group = self.placement_group(node_class).await?;
            Ok(placement_group::drift(claim, group.as_ref()))
        })
    }

    fn repair_policies(&self) -> &'static [RepairPolicy] {
        EC2_REPAIR_POLICIES
    }

    fn impaired_instances(&self) -> CloudFuture<'_, Vec<InstanceHealth>> {
        Box::pin(instance_status::impaired(&self.inner.clients))
    }

    fn reserved_capacity(&self) -> HashMap<String, u32> {
        self.inner.reservation_room.counts_now()
    }

    fn reservation_reclaimed(&self, id: &str) {
        self.inner.reservation_room.exhausted(id);
    }
}

/// DescribePlacementGroups for `selector`, its errors as every cloud error.
async fn describe_placement_group(
    clients: &AwsClients,
    selector: PlacementGroupSelector,
) -> Result<Option<PlacementGroup>, CloudError> {
    Ok(placement_groups::describe(clients, &selector).await?)
}

/// Why an instance placed as `placement` no longer matches `status`, if it does not.
fn drift(placement: &instances::Placement, status: &EC2NodeClassStatus) -> Option<Drift> {
    joist_provider::node_class::drift(
        status,
        &placement.image_id,
        |subnet| subnet.id == placement.subnet_id,
        Some(&placement.security_group_ids),
        placement.reservation_id.as_deref(),
    )
}

#[cfg(test)]
mod tests {
    use joist_messages::apis::ec2nodeclass::{ResolvedAmi, ResolvedSecurityGroup, ResolvedSubnet};

    use super::*;

    fn status() -> EC2NodeClassStatus {
        EC2NodeClassStatus {
            subnets: vec![ResolvedSubnet {
                id: "subnet-1".into(),
                zone: "us-west-2a".into(),
                zone_id: None,
            }],
            security_groups: ["sg-1", "sg-2"]
                .map(|id| ResolvedSecurityGroup {
                    id: id.into(),
                    name: None,
                })
                .to_vec(),
            amis: vec![ResolvedAmi {
                id: "ami-new".into(),
                name: None,
                deprecated: false,
                requirements: Vec::new(),
            }],
            ..EC2NodeClassStatus::default()
        }
    }

    fn placed(image: &str, subnet: &str, groups: &[&str]) -> instances::Placement {
        instances::Placement {
            image_id: image.into(),
            subnet_id: subnet.into(),
            security_group_ids: groups.iter().map(|g| (*g).to_owned()).collect(),
            reservation_id: None,
            partition: None,
        }
    }

    #[test]
    fn an_instance_drifts_when_its_image_subnet_or_groups_left_the_class() {
        let reason = |p: instances::Placement| drift(&p, &status()).map(|d| d.reason);
        assert_eq!(reason(placed("ami-new", "subnet-1", &["sg-2", "sg-1"])), None);
        assert_eq!(
            reason(placed("ami-old", "subnet-1", &["sg-1", "sg-2"])).as_deref(),
            Some("AMIDrift")
        );
        assert_eq!(
            reason(placed("ami-new", "subnet-9", &["sg-1", "sg-2"])).as_deref(),
            Some("SubnetDrift")
        );
        assert_eq!(
            reason(placed("ami-new", "subnet-1", &["sg-1"])).as_deref(),
            Some("SecurityGroupDrift")
        );
    }
}
