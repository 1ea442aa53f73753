//! Prometheus summaries, which prometheus-client does not have: quantiles 0, 0.5, 0.9, 0.99 and 1
//! (Karpenter's objectives) over a label's most recent [`WINDOW`] observations, with their sum and
//! count since the start. Karpenter's performance dashboard reads two of them by `quantile`.
//!
//! Exposed as three gauge families (`name{…,quantile}`, `name_sum`, `name_count`), since
//! prometheus-client's encoder has no summary type; a query by `quantile` reads them as it reads a
//! summary. Karpenter's summaries forget observations after 10 minutes; these keep the last
//! [`WINDOW`] per label instead, so memory is bounded whatever the rate.

use std::{
    collections::{BTreeMap, VecDeque},
    fmt,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use prometheus_client::{collector::Collector, encoding::DescriptorEncoder, metrics::MetricType};

/// Observations each label keeps for its quantiles.
pub const WINDOW: usize = 1_000;

/// Karpenter's summary objectives.
const QUANTILES: [(f64, &str); 5] = [(0.0, "0"), (0.5, "0.5"), (0.9, "0.9"), (0.99, "0.99"), (1.0, "1")];

/// A summary by one label (see the module docs). Cheap to clone: clones share the observations.
#[derive(Clone)]
pub struct Summary {
    name: &'static str,
    help: &'static str,
    label: Option<&'static str>,
    series: Arc<Mutex<BTreeMap<String, Series>>>,
}

#[derive(Default)]
struct Series {
    recent: VecDeque<f64>,
    sum: f64,
    count: u64,
}

impl Series {
    fn sum(&self) -> f64 {
        self.sum
    }

    fn count(&self) -> f64 {
        self.count as f64
    }
}

impl Summary {
    /// A summary `name` whose series are told apart by `label` (one series without).
    pub fn new(name: &'static str, help: &'static str, label: Option<&'static str>) -> Self {
        Self {
            name,
            help,
            label,
            series: Arc::default(),
        }
    }

    /// The summary's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Records `value` for the label value `of` ("" without a label).
    pub fn observe(&self, of: &str, value: f64) {
        let mut all = self.lock();
        let series = all.entry(of.to_owned()).or_default();
        if series.recent.len() == WINDOW {
            series.recent.pop_front();
        }
        series.recent.push_back(value);
        series.sum += value;
        series.count += 1;
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Series>> {
        self.series.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The `q` quantile of `sorted` (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let last = sorted.len().saturating_sub(1);
    let rank = (q * last as f64).round() as usize;
    sorted.get(rank.min(last)).copied().unwrap_or(0.0)
}

impl fmt::Debug for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Summary")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Summary {
    /// The series' labels: the summary's label with the value `of`, if it has one.
    fn labels<'a>(&self, of: &'a str) -> Vec<(&'static str, &'a str)> {
        self.label.map(|label| (label, of)).into_iter().collect()
    }
}

impl Collector for Summary {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let all = self.lock();
        let mut quantiles = encoder.encode_descriptor(self.name, self.help, None, MetricType::Gauge)?;
        for (of, series) in all.iter() {
            let mut sorted: Vec<f64> = series.recent.iter().copied().collect();
            sorted.sort_by(f64::total_cmp);
            for (q, text) in QUANTILES {
                let mut labels = self.labels(of);
                labels.push(("quantile", text));
                quantiles
                    .encode_family(&labels)?
                    .encode_gauge(&quantile(&sorted, q))?;
            }
        }
        for (suffix, value) in [
            ("sum", Series::sum as fn(&Series) -> f64),
            ("count", Series::count),
        ] {
            let name = format!("{}_{suffix}", self.name);
            let mut metric = encoder.encode_descriptor(&name, self.help, None, MetricType::Gauge)?;
            for (of, series) in all.iter() {
                match self.label {
                    Some(_) => metric
                        .encode_family(&self.labels(of))?
                        .encode_gauge(&value(series))?,
                    None => metric.encode_gauge(&value(series))?,
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_read_off_the_recent_observations() {
        let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&sorted, 0.0), 1.0);
        assert_eq!(quantile(&sorted, 0.5), 51.0);
        assert_eq!(quantile(&sorted, 0.99), 99.0);
        assert_eq!(quantile(&sorted, 1.0), 100.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn a_series_keeps_a_bounded_window_and_counts_everything() {
        let summary = Summary::new("s", "h", Some("nodepool"));
        for i in 0..(WINDOW + 500) {
            summary.observe("default", i as f64);
        }
        let all = summary.lock();
        let series = &all["default"];
        assert_eq!(series.recent.len(), WINDOW);
        assert_eq!(series.count, (WINDOW + 500) as u64);
        assert_eq!(series.recent.front(), Some(&500.0), "the oldest are forgotten");
    }
}
