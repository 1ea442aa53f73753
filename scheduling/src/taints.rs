//! Taints and tolerations, with Kubernetes' matching rules.
//!
//! A toleration matches a taint when the effects agree (an empty toleration effect matches every
//! effect) and either the operator is `Exists` (an empty key then matches every key) or the keys
//! and values are equal (`Equal`, the default). For provisioning, every taint a node would carry
//! must be tolerated, `PreferNoSchedule` included: Karpenter treats preferences as requirements and
//! only relaxes them when nothing else fits.
//!
//! [`Toleration`] is the simulation's own form: hashable, so pods with the same tolerations share
//! one scheduling class.

use k8s_openapi::api::core::v1::{Taint, Toleration as KubeToleration};

/// The `PreferNoSchedule` taint effect.
pub const PREFER_NO_SCHEDULE: &str = "PreferNoSchedule";

/// A pod's toleration (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Toleration {
    /// The taint key; empty with `exists` matches every key.
    pub key: String,
    /// `Exists` (true) or `Equal` (false, the default).
    pub exists: bool,
    /// The value `Equal` compares.
    pub value: String,
    /// The effect; empty matches every effect.
    pub effect: String,
}

impl Toleration {
    /// Tolerates every taint with `effect`.
    pub fn all_with_effect(effect: &str) -> Self {
        Toleration {
            key: String::new(),
            exists: true,
            value: String::new(),
            effect: effect.to_string(),
        }
    }

    /// True when this toleration tolerates `taint`.
    pub fn tolerates(&self, taint: &Taint) -> bool {
        if !(self.effect.is_empty() || self.effect == taint.effect) {
            return false;
        }
        if self.exists {
            self.key.is_empty() || self.key == taint.key
        } else {
            self.key == taint.key && self.value == taint.value.as_deref().unwrap_or_default()
        }
    }
}

impl From<&KubeToleration> for Toleration {
    fn from(t: &KubeToleration) -> Self {
        Toleration {
            key: t.key.clone().unwrap_or_default(),
            exists: t.operator.as_deref() == Some("Exists"),
            value: t.value.clone().unwrap_or_default(),
            effect: t.effect.clone().unwrap_or_default(),
        }
    }
}

/// The first of `taints` that none of `tolerations` tolerates, if any.
pub fn first_untolerated<'a>(tolerations: &[Toleration], taints: &'a [Taint]) -> Option<&'a Taint> {
    taints
        .iter()
        .find(|taint| !tolerations.iter().any(|t| t.tolerates(taint)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn toleration(
        key: Option<&str>,
        operator: Option<&str>,
        value: Option<&str>,
        effect: Option<&str>,
    ) -> Toleration {
        Toleration::from(&KubeToleration {
            key: key.map(Into::into),
            operator: operator.map(Into::into),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            toleration_seconds: None,
        })
    }

    #[test]
    fn equal_needs_key_and_value() {
        let gpu = taint("nvidia.com/gpu", Some("true"), "NoSchedule");
        assert!(toleration(Some("nvidia.com/gpu"), None, Some("true"), None).tolerates(&gpu));
        assert!(!toleration(Some("nvidia.com/gpu"), Some("Equal"), Some("false"), None).tolerates(&gpu));
        assert!(!toleration(Some("other"), None, Some("true"), None).tolerates(&gpu));
    }

    #[test]
    fn exists_ignores_the_value_and_an_empty_key_matches_all() {
        let gpu = taint("nvidia.com/gpu", Some("true"), "NoSchedule");
        assert!(toleration(Some("nvidia.com/gpu"), Some("Exists"), None, None).tolerates(&gpu));
        assert!(toleration(None, Some("Exists"), None, None).tolerates(&gpu));
        assert!(
            !toleration(None, None, None, None).tolerates(&gpu),
            "empty key with Equal matches nothing"
        );
    }

    #[test]
    fn effects_must_agree_unless_the_toleration_has_none() {
        let t = taint("dedicated", Some("batch"), "NoExecute");
        assert!(!toleration(Some("dedicated"), None, Some("batch"), Some("NoSchedule")).tolerates(&t));
        assert!(toleration(Some("dedicated"), None, Some("batch"), Some("NoExecute")).tolerates(&t));
    }

    #[test]
    fn reports_the_first_untolerated_taint() {
        let taints = [
            taint("a", None, "NoSchedule"),
            taint("b", None, PREFER_NO_SCHEDULE),
        ];
        let tols = [toleration(Some("a"), Some("Exists"), None, None)];
        assert_eq!(
            first_untolerated(&tols, &taints).map(|t| t.key.as_str()),
            Some("b")
        );
        assert_eq!(
            first_untolerated(&[Toleration::all_with_effect(PREFER_NO_SCHEDULE)], &taints[1..]),
            None
        );
    }
}
