//! Criterion benchmarks of one `solve` call (problem construction is not timed), on Karpenter's
//! diverse benchmark at several sizes and on the larger problems; and of the consolidation search
//! on a fragmented cluster (setting the search up, one single-node candidate, the multi-node search
//! over all).
//! `cargo bench -p joist-scheduling`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_main};
use joist_messages::model::instance_type::CapacityType;
use joist_scheduling::{
    consolidation::{Candidate, Search, Settings},
    solve, workloads,
};

fn diverse(c: &mut Criterion) {
    let mut group = c.benchmark_group("diverse");
    group.sample_size(10);
    for pods in [100, 1_000, 5_000, 20_000] {
        let input = workloads::karpenter_diverse(pods);
        group.throughput(Throughput::Elements(pods as u64));
        group.bench_with_input(BenchmarkId::from_parameter(pods), &input, |b, input| {
            b.iter(|| black_box(solve(input)));
        });
    }
    group.finish();
}

fn larger(c: &mut Criterion) {
    let mut group = c.benchmark_group("larger");
    group.sample_size(10);
    let existing = workloads::existing_cluster(1_000, 5_000);
    group.bench_function("existing-1000-nodes-5000-pods", |b| {
        b.iter(|| black_box(solve(&existing)))
    });
    let pools = workloads::many_node_pools(5_000);
    group.bench_function("20-node-pools-5000-pods", |b| b.iter(|| black_box(solve(&pools))));
    group.finish();
}

fn consolidation(c: &mut Criterion) {
    let mut group = c.benchmark_group("consolidation");
    group.sample_size(10);
    for nodes in [100, 1_000] {
        let base = workloads::fragmented_cluster(nodes, 0.6);
        let candidates: Vec<Candidate> = (0..base.nodes.len())
            .map(|node| Candidate {
                node,
                price: 1.0,
                capacity_type: CapacityType::OnDemand,
                pods: base.nodes[node].pods.clone(),
                held: None,
            })
            .collect();
        let order: Vec<usize> = (0..candidates.len()).collect();
        group.bench_function(BenchmarkId::new("search-set-up", nodes), |b| {
            b.iter(|| black_box(Search::new(&base, &candidates, Settings::default())))
        });
        let mut search = Search::new(&base, &candidates, Settings::default());
        group.bench_function(BenchmarkId::new("single-node-candidate", nodes), |b| {
            b.iter(|| black_box(search.consolidate(&[0]).is_ok()))
        });
        group.bench_function(BenchmarkId::new("multi-node-search", nodes), |b| {
            b.iter(|| black_box(search.largest_prefix(&order).is_some()))
        });
    }
    group.finish();
}

// The macro defines an undocumented entry point.
#[allow(missing_docs)]
mod entry {
    criterion::criterion_group!(benches, super::diverse, super::larger, super::consolidation);
}
criterion_main!(entry::benches);
