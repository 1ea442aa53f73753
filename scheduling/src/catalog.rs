//! Each NodePool's launchable instance types, prepared once per solve.
//!
//! A [`PoolPlan`] keeps the types compatible with the NodePool's requirements (labels and
//! `karpenter.sh/nodepool` included) that have an available offering, ordered by their cheapest
//! such offering. For each it stores, as fixed-width vectors, the allocatable resources minus the
//! overhead of the daemonsets that would run there, and the capacity that counts against limits.
//! New NodeClaims hold their candidates as bit sets over these positions; narrowing a claim to one
//! topology domain intersects it with a cached per-domain set.

use std::{collections::HashMap, sync::Arc};

use joist_messages::{
    labels::{CAPACITY_TYPE, ZONE},
    model::{
        instance_type::{CapacityType, InstanceType, Offering},
        requirements::{Operator, Requirement, Requirements},
        resources::names,
    },
};
use k8s_openapi::api::core::v1::Taint;

use crate::{
    amounts::AmountIndex,
    bitset,
    dims::{self, Dims},
    input::NodePoolInput,
    pod::{HostPort, PodInfo},
    reservations::Ledger,
    taints::Toleration,
};

/// A NodePool `minValues` requirement, with each type's value numbered.
#[derive(Debug, Clone)]
pub(crate) struct MinValues {
    /// The label key.
    pub key: String,
    /// Distinct values needed.
    pub needed: u32,
    /// Per type position, the number of its value (`u32::MAX` when it has none).
    pub value_of: Vec<u32>,
    /// How many distinct values are numbered.
    pub distinct: usize,
}

/// One NodePool, prepared (see the module docs).
#[derive(Debug)]
pub(crate) struct PoolPlan {
    /// Position in `Input::node_pools`.
    pub input: usize,
    /// The NodePool's name.
    pub name: String,
    /// Template requirements plus labels plus `karpenter.sh/nodepool`.
    pub requirements: Requirements,
    /// Template taints.
    pub taints: Vec<Taint>,
    /// Catalog positions, cheapest first.
    pub types: Vec<usize>,
    /// Allocatable minus daemonset overhead, `types.len() × dims`.
    pub alloc: Vec<i64>,
    /// Capacity, `types.len() × dims`, for limits.
    pub capacity: Vec<i64>,
    /// The positions by allocatable amount: which have room for a claim's pods.
    by_allocatable: AmountIndex,
    /// The positions by capacity amount: which stay within the limits.
    by_capacity: AmountIndex,
    /// Every position.
    pub all: Vec<u64>,
    /// Host ports of the daemonsets that run on this NodePool's nodes.
    pub daemon_ports: Vec<HostPort>,
    /// `minValues` requirements.
    pub min_values: Vec<MinValues>,
    /// Limits minus usage, per dimension; `None` when unlimited.
    pub remaining: Option<Vec<i64>>,
    /// Nodes that may still be launched; `None` when unlimited.
    pub remaining_nodes: Option<i64>,
    /// Per topology key and domain: the positions whose types can be in that domain.
    domain_sets: Vec<Vec<Vec<u64>>>,
    /// The zones any offering is in, numbered for [`OfferingMask`].
    zones: Vec<String>,
    /// Per position, its available offerings as (zone number, capacity type, price).
    offers: Vec<Vec<(u32, CapacityType, f64)>>,
    /// Per position, its available reserved offerings as (reservation number in the solve's
    /// [`Ledger`], offering index in the type); empty when no type has one.
    reserved: Vec<Vec<(u32, u32)>>,
    /// The positions with a reserved offering.
    with_reserved: Vec<u64>,
}

/// The zones and capacity types a NodeClaim's requirements still allow, as bits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OfferingMask {
    zones: u64,
    capacity_types: u8,
}

fn capacity_bit(c: CapacityType) -> u8 {
    match c {
        CapacityType::Spot => 1,
        CapacityType::OnDemand => 2,
        CapacityType::Reserved => 4,
    }
}

/// True when some available offering of `it` is allowed by `reqs`.
pub(crate) fn has_offering(it: &InstanceType, reqs: &Requirements) -> bool {
    it.offerings.iter().any(|o| offering_allowed(o, reqs))
}

/// True when `o` is available and `reqs` allow it ([`Offering::allowed_by`]).
pub(crate) fn offering_allowed(o: &Offering, reqs: &Requirements) -> bool {
    o.available && o.allowed_by(reqs)
}

/// The cheapest available offering price of `it` under `reqs`.
pub(crate) fn price(it: &InstanceType, reqs: &Requirements) -> Option<f64> {
    it.cheapest_offering(|o| offering_allowed(o, reqs))
        .map(|o| o.price)
}

/// True when `it` can launch under `reqs`: labels intersect and an offering is allowed.
pub(crate) fn type_allowed(it: &InstanceType, reqs: &Requirements) -> bool {
    it.requirements.overlaps(reqs) && has_offering(it, reqs)
}

/// True when a daemonset pod tolerates `taints` (only `NoSchedule` and `NoExecute` keep it off).
fn daemon_tolerates(tolerations: &[Toleration], taints: &[Taint]) -> bool {
    taints
        .iter()
        .filter(|t| t.effect != crate::taints::PREFER_NO_SCHEDULE)
        .all(|t| tolerations.iter().any(|tol| tol.tolerates(t)))
}

impl PoolPlan {
    /// Prepares `pool` (position `input`) over `catalog`.
    pub(crate) fn new(
        input: usize,
        pool: &NodePoolInput,
        catalog: &[Arc<InstanceType>],
        daemonsets: &[PodInfo],
        dims: &Dims,
    ) -> Self {
        let requirements = pool.node_requirements();
        let mut priced: Vec<(f64, usize)> = pool
            .instance_types
            .iter()
            .filter_map(|&i| {
                let it = catalog.get(i)?;
                if !it.requirements.overlaps(&requirements) {
                    return None;
                }
                price(it, &requirements).map(|p| (p, i))
            })
            .collect();
        priced.sort_by(|a, b| {
            a.0.total_cmp(&b.0)
                .then_with(|| catalog[a.1].name.cmp(&catalog[b.1].name))
        });
        let types: Vec<usize> = priced.into_iter().map(|(_, i)| i).collect();

        let daemons: Vec<&PodInfo> = daemonsets
            .iter()
            .filter(|d| {
                let c = d.constraints();
                daemon_tolerates(&c.tolerations, &pool.taints)
                    && c.node_requirements[0].overlaps(&requirements)
            })
            .collect();
        let mut daemon_ports: Vec<HostPort> = daemons
            .iter()
            .flat_map(|d| d.constraints().host_ports.iter().copied())
            .collect();
        daemon_ports.sort_unstable();

        let d = dims.len();
        let mut alloc = Vec::with_capacity(types.len() * d);
        let mut capacity = Vec::with_capacity(types.len() * d);
        for &i in &types {
            let it = &catalog[i];
            let start = alloc.len();
            dims.extend_vector(&it.allocatable(), &mut alloc);
            for daemon in &daemons {
                if daemon.constraints().node_requirements[0].overlaps(&it.requirements) {
                    dims::sub(&mut alloc[start..], &dims.vector(&daemon.requests));
                }
            }
            dims.extend_vector(&it.capacity, &mut capacity);
        }

        let min_values = requirements
            .iter()
            .filter_map(|r| r.min_values().map(|needed| (r.key().to_string(), needed)))
            .map(|(key, needed)| {
                let mut numbers: HashMap<&str, u32> = HashMap::new();
                let value_of = types
                    .iter()
                    .map(|&i| {
                        catalog[i]
                            .requirements
                            .get(&key)
                            .filter(|r| r.operator() == Operator::In)
                            .and_then(|r| r.values().next())
                            .map_or(u32::MAX, |v| {
                                let next = numbers.len() as u32;
                                *numbers.entry(v).or_insert(next)
                            })
                    })
                    .collect();
                MinValues {
                    key,
                    needed,
                    value_of,
                    distinct: numbers.len(),
                }
            })
            .collect();

        let mut zones: Vec<String> = Vec::new();
        let offers = types
            .iter()
            .map(|&i| {
                catalog[i]
                    .offerings
                    .iter()
                    .filter(|o| o.available)
                    .map(|o| {
                        let zone = zones.iter().position(|z| *z == o.zone).unwrap_or_else(|| {
                            zones.push(o.zone.clone());
                            zones.len() - 1
                        });
                        (zone as u32, o.capacity_type, o.price)
                    })
                    .collect()
            })
            .collect();
        let remaining_nodes = pool
            .remaining
            .as_ref()
            .and_then(|r| r.get(names::NODES))
            .map(|q| q.millis() / 1000);
        // Dimensions the NodePool does not limit are unbounded.
        let remaining = pool.remaining.as_ref().map(|r| {
            (0..dims.len())
                .map(|i| r.get(dims.name(i)).map_or(i64::MAX, |q| q.millis()))
                .collect()
        });
        PoolPlan {
            input,
            name: pool.name.clone(),
            all: bitset::full(types.len()),
            by_allocatable: AmountIndex::new(&alloc, types.len(), d),
            by_capacity: AmountIndex::new(&capacity, types.len(), d),
            requirements,
            taints: pool.taints.clone(),
            types,
            alloc,
            capacity,
            daemon_ports,
            min_values,
            remaining,
            remaining_nodes,
            domain_sets: Vec::new(),
            zones,
            offers,
            reserved: Vec::new(),
            with_reserved: Vec::new(),
        }
    }

    /// Numbers the reserved offerings of each position by `ledger`'s reservations.
    pub(crate) fn index_reservations(&mut self, ledger: &Ledger, catalog: &[Arc<InstanceType>]) {
        if ledger.is_empty() {
            return;
        }
        self.with_reserved = vec![0; self.all.len()];
        self.reserved = self
            .types
            .iter()
            .enumerate()
            .map(|(t, &i)| {
                let offered: Vec<(u32, u32)> = catalog[i]
                    .offerings
                    .iter()
                    .enumerate()
                    .filter(|(_, o)| o.available)
                    .filter_map(|(o, offering)| {
                        let id = &offering.reservation.as_ref()?.reservation.id;
                        Some((ledger.number(id)?, o as u32))
                    })
                    .collect();
                if !offered.is_empty() {
                    bitset::insert(&mut self.with_reserved, t);
                }
                offered
            })
            .collect();
    }

    /// Puts into `into`, each once, the reservations of the available reserved offerings of the
    /// positions in `candidates` that `allowed` accepts; true when there were any.
    pub(crate) fn reservations_of(
        &self,
        candidates: &[u64],
        catalog: &[Arc<InstanceType>],
        allowed: impl Fn(&Offering) -> bool,
        into: &mut Vec<u32>,
    ) -> bool {
        into.clear();
        if self.reserved.is_empty() || !bitset::intersects(candidates, &self.with_reserved) {
            return false;
        }
        for t in bitset::members(candidates).filter(|&t| bitset::contains(&self.with_reserved, t)) {
            let offerings = &catalog[self.types[t]].offerings;
            for &(r, o) in &self.reserved[t] {
                if !into.contains(&r) && allowed(&offerings[o as usize]) {
                    into.push(r);
                }
            }
        }
        !into.is_empty()
    }

    /// The zones and capacity types `reqs` allows (zones past the 64th are always allowed).
    pub(crate) fn offering_mask(&self, reqs: &Requirements) -> OfferingMask {
        let zone_req = reqs.get(ZONE);
        let capacity_req = reqs.get(CAPACITY_TYPE);
        let zones = self
            .zones
            .iter()
            .enumerate()
            .filter(|(i, z)| *i >= 64 || zone_req.is_none_or(|r| r.has(z)))
            .fold(0u64, |mask, (i, _)| mask | (1u64 << i.min(63)));
        let capacity_types = [CapacityType::Spot, CapacityType::OnDemand, CapacityType::Reserved]
            .into_iter()
            .filter(|c| capacity_req.is_none_or(|r| r.has(c.label())))
            .fold(0u8, |mask, c| mask | capacity_bit(c));
        OfferingMask {
            zones,
            capacity_types,
        }
    }

    /// The cheapest available offering price of position `t` within `mask`.
    pub(crate) fn price_within(&self, t: usize, mask: OfferingMask) -> Option<f64> {
        self.offers[t]
            .iter()
            .filter(|(zone, ct, _)| {
                mask.zones & (1u64 << (*zone).min(63)) != 0 && mask.capacity_types & capacity_bit(*ct) != 0
            })
            .map(|(_, _, price)| *price)
            .min_by(f64::total_cmp)
    }

    /// The allocatable vector of position `t`.
    pub(crate) fn alloc_of(&self, t: usize, dims: usize) -> &[i64] {
        &self.alloc[t * dims..(t + 1) * dims]
    }

    /// Removes from `set` the positions whose allocatable cannot hold `used + request` (`used` empty
    /// for nothing yet).
    pub(crate) fn keep_with_room(&self, used: &[i64], request: &[i64], set: &mut [u64]) {
        self.by_allocatable.keep_at_least(used, request, set);
    }

    /// Removes from `set` the positions whose capacity would take the NodePool past its limits,
    /// with `reserved` already held for the claim (empty for none); false when the limits leave
    /// none. A NodePool without limits leaves `set` as it is.
    pub(crate) fn keep_affordable(&self, reserved: &[i64], set: &mut [u64]) -> bool {
        let Some(remaining) = &self.remaining else {
            return true;
        };
        self.by_capacity.keep_at_most(reserved, remaining, set);
        !bitset::is_empty(set)
    }

    /// The capacity vector of position `t`.
    pub(crate) fn capacity_of(&self, t: usize, dims: usize) -> &[i64] {
        &self.capacity[t * dims..(t + 1) * dims]
    }

    /// Computes, for each topology key (name and domain values, in `Topology` order), the
    /// positions whose types can be in each domain. Hostname keys get no sets.
    pub(crate) fn index_domains<'a>(
        &mut self,
        keys: impl Iterator<Item = (&'a str, bool, &'a [String])>,
        catalog: &[Arc<InstanceType>],
    ) {
        self.domain_sets = keys
            .map(|(key, hostname, domains)| {
                if hostname {
                    return Vec::new();
                }
                domains
                    .iter()
                    .map(|domain| {
                        let mut set = vec![0u64; bitset::words(self.types.len())];
                        let narrowed: Requirements = Requirement::new(key, Operator::In, [domain.as_str()])
                            .into_iter()
                            .collect();
                        for (t, &i) in self.types.iter().enumerate() {
                            if type_allowed(&catalog[i], &narrowed) {
                                set[t / 64] |= 1 << (t % 64);
                            }
                        }
                        set
                    })
                    .collect()
            })
            .collect();
    }

    /// The positions whose types can be in domain `d` of topology key `key`.
    pub(crate) fn domain_set(&self, key: usize, d: u32) -> &[u64] {
        &self.domain_sets[key][d as usize]
    }

    /// Every distinct value of `key` that a type of this NodePool can have, with the template's
    /// own `In` values when no type defines the key.
    pub(crate) fn domains(&self, key: &str, catalog: &[Arc<InstanceType>]) -> Vec<String> {
        let template = self.requirements.get(key);
        let mut out: Vec<String> = Vec::new();
        for &i in &self.types {
            let it = &catalog[i];
            let offered = |value: fn(&Offering) -> &str| {
                it.offerings
                    .iter()
                    .filter(|o| offering_allowed(o, &self.requirements))
                    .map(value)
                    .collect()
            };
            let values: Vec<&str> = match key {
                ZONE => offered(|o| o.zone.as_str()),
                CAPACITY_TYPE => offered(|o| o.capacity_type.label()),
                _ => it
                    .requirements
                    .get(key)
                    .filter(|r| r.operator() == Operator::In)
                    .map(|r| r.values().collect())
                    .unwrap_or_default(),
            };
            for v in values {
                if template.is_none_or(|r| r.has(v)) && !out.iter().any(|o| o == v) {
                    out.push(v.to_string());
                }
            }
        }
        if out.is_empty()
            && let Some(r) = template.filter(|r| r.operator() == Operator::In)
        {
            out.extend(r.values().map(str::to_string));
        }
        out
    }

    /// Distinct values left among `candidates` for each `minValues` key: the first shortfall.
    pub(crate) fn min_values_shortfall(
        &self,
        candidates: &[u64],
        seen: &mut Vec<bool>,
    ) -> Option<(&str, u32, usize)> {
        for mv in &self.min_values {
            seen.clear();
            seen.resize(mv.distinct, false);
            let mut found = 0usize;
            for t in bitset::members(candidates) {
                let v = mv.value_of[t];
                if v != u32::MAX && !seen[v as usize] {
                    seen[v as usize] = true;
                    found += 1;
                    if found >= mv.needed as usize {
                        break;
                    }
                }
            }
            if found < mv.needed as usize {
                return Some((&mv.key, mv.needed, found));
            }
        }
        None
    }
}
