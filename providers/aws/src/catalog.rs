//! The instance types EC2 sells in the region, read from the wire: `DescribeInstanceTypes`
//! (hardware-virtualized x86-64 and arm64 types, pages of 100) and
//! `DescribeInstanceTypeOfferings` (zones, pages of 1,000), every page followed. Each type becomes
//! the shared [`Ec2Shape`], so capacity, overhead and the `karpenter.k8s.aws/*` labels are computed
//! exactly as for the simulated cloud's committed catalog.
//!
//! Failures: an API error is returned with its operation; a type whose answer lacks its name,
//! vCPUs, memory or a supported architecture is skipped (and counted in the debug log), as
//! Karpenter skips types it cannot describe.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types::{Filter, InstanceTypeInfo, LocationType};
use joist_messages::model::shape::{Ec2Shape, Gpu};

use crate::error::AwsError;

/// Page size of `DescribeInstanceTypes` (its maximum).
const INSTANCE_TYPES_PAGE: i32 = 100;
/// Page size of `DescribeInstanceTypeOfferings` (its maximum).
const OFFERINGS_PAGE: i32 = 1_000;

/// Every instance type's shape, by name.
pub async fn shapes(ec2: &aws_sdk_ec2::Client) -> Result<BTreeMap<String, Ec2Shape>, AwsError> {
    let filter = |name: &str, values: &[&str]| {
        values
            .iter()
            .fold(Filter::builder().name(name), |f, v| f.values(*v))
            .build()
    };
    let infos = ec2
        .describe_instance_types()
        .filters(filter("supported-virtualization-type", &["hvm"]))
        .filters(filter(
            "processor-info.supported-architecture",
            &["x86_64", "arm64"],
        ))
        .max_results(INSTANCE_TYPES_PAGE)
        .into_paginator()
        .items()
        .send()
        .try_collect()
        .await
        .map_err(|e| AwsError::api("DescribeInstanceTypes", e.into_service_error()))?;
    let total = infos.len();
    let shapes: BTreeMap<String, Ec2Shape> = infos
        .iter()
        .filter_map(shape)
        .map(|shape| (shape.name.clone(), shape))
        .collect();
    let skipped = total - shapes.len();
    if skipped > 0 {
        tracing::debug!(
            skipped,
            "instance types without a name, vCPUs, memory or architecture"
        );
    }
    Ok(shapes)
}

/// The zones each instance type is offered in.
pub async fn zones(ec2: &aws_sdk_ec2::Client) -> Result<BTreeMap<String, BTreeSet<String>>, AwsError> {
    let offerings = ec2
        .describe_instance_type_offerings()
        .location_type(LocationType::AvailabilityZone)
        .max_results(OFFERINGS_PAGE)
        .into_paginator()
        .items()
        .send()
        .try_collect()
        .await
        .map_err(|e| AwsError::api("DescribeInstanceTypeOfferings", e.into_service_error()))?;
    let mut zones: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for offering in &offerings {
        if let (Some(name), Some(zone)) = (offering.instance_type(), offering.location()) {
            zones
                .entry(name.as_str().to_owned())
                .or_default()
                .insert(zone.to_owned());
        }
    }
    Ok(zones)
}

/// The Kubernetes name (`amd64`, `arm64`) of an EC2 architecture (`x86_64`, `arm64`); `None` for
/// architectures Joist does not run.
pub fn kubernetes_arch(ec2_arch: &str) -> Option<&'static str> {
    match ec2_arch {
        "x86_64" => Some("amd64"),
        "arm64" => Some("arm64"),
        _ => None,
    }
}

/// The shape of one `DescribeInstanceTypes` item, `None` when it lacks what a shape needs.
pub fn shape(info: &InstanceTypeInfo) -> Option<Ec2Shape> {
    let name = info.instance_type()?.as_str().to_owned();
    let processor = info.processor_info()?;
    let arch = processor
        .supported_architectures()
        .iter()
        .find_map(|a| kubernetes_arch(a.as_str()))?;
    let network = info.network_info();
    let default_card = network.and_then(|n| {
        let index = n.default_network_card_index().unwrap_or(0);
        let cards = n.network_cards();
        cards
            .iter()
            .find(|c| c.network_card_index() == Some(index))
            .or_else(|| cards.first())
    });
    let storage = info.instance_storage_info();
    let nvme = storage.is_some_and(|s| {
        s.nvme_support()
            .is_some_and(|n| matches!(n.as_str(), "required" | "supported"))
    });
    let gpu = info.gpu_info().and_then(|g| g.gpus().first()).map(|g| Gpu {
        name: g.name().unwrap_or_default().to_lowercase(),
        manufacturer: g.manufacturer().unwrap_or_default().to_lowercase(),
        count: i64::from(g.count().unwrap_or(0)),
        memory_mib: i64::from(g.memory_info().and_then(|m| m.size_in_mib()).unwrap_or(0)),
    });
    Some(Ec2Shape {
        name,
        vcpus: i64::from(info.v_cpu_info()?.default_v_cpus()?),
        memory_mib: info.memory_info()?.size_in_mib()?,
        arch: arch.to_owned(),
        hypervisor: info
            .hypervisor()
            .map(|h| h.as_str().to_owned())
            .unwrap_or_default(),
        cpu_manufacturer: processor.manufacturer().unwrap_or_default().to_lowercase(),
        clock_mhz: processor
            .sustained_clock_speed_in_ghz()
            .map_or(0, |ghz| (ghz * 1000.0).round() as i64),
        max_enis: i64::from(network.and_then(|n| n.maximum_network_interfaces()).unwrap_or(0)),
        ipv4_per_eni: i64::from(
            network
                .and_then(|n| n.ipv4_addresses_per_interface())
                .unwrap_or(0),
        ),
        network_bandwidth_mbps: default_card
            .and_then(|c| c.baseline_bandwidth_in_gbps())
            .map_or(0, |gbps| (gbps * 1000.0).round() as i64),
        ebs_bandwidth_mbps: i64::from(
            info.ebs_info()
                .and_then(|e| e.ebs_optimized_info())
                .and_then(|e| e.maximum_bandwidth_in_mbps())
                .unwrap_or(0),
        ),
        local_nvme_gb: if nvme {
            storage.and_then(|s| s.total_size_in_gb()).unwrap_or(0)
        } else {
            0
        },
        bare_metal: info.bare_metal().unwrap_or(false),
        encryption_in_transit: network
            .and_then(|n| n.encryption_in_transit_supported())
            .unwrap_or(false),
        gpu,
        network_cards: i64::from(network.and_then(|n| n.maximum_network_cards()).unwrap_or(1)),
        efa_interfaces: network
            .filter(|n| n.efa_supported().unwrap_or(false))
            .and_then(|n| n.efa_info()?.maximum_efa_interfaces())
            .map_or(0, i64::from),
    })
}
