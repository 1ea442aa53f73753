//! One run at a time, with requests that arrive during a run folded into one more run: how the
//! Provisioner treats batches and a NodeClaim actor treats pokes. Pure state; nothing fails.

/// See the module docs.
#[derive(Debug, Default)]
pub struct Fold {
    running: bool,
    again: bool,
}

impl Fold {
    /// Whether a run may start now; while one runs, one more run is owed instead.
    pub fn start(&mut self) -> bool {
        if self.running {
            self.again = true;
            return false;
        }
        self.running = true;
        true
    }

    /// The run ended: `true` when requests came meanwhile and the caller must run again at once
    /// (it still counts as running), `false` when the next request may start a run.
    pub fn finish(&mut self) -> bool {
        if std::mem::take(&mut self.again) {
            return true;
        }
        self.running = false;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_during_a_run_fold_into_one_more_run() {
        let mut fold = Fold::default();
        assert!(fold.start());
        assert!(!fold.start() && !fold.start(), "a run is going");
        assert!(fold.finish(), "one more run is owed, however many came");
        assert!(!fold.finish(), "then none");
        assert!(fold.start(), "idle again");
    }
}
