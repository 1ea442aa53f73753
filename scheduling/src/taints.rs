//! Taints and tolerations, with Kubernetes' matching rules.
//!
//! A toleration matches a taint when the effects agree (an empty toleration effect matches every
//! effect) and either the operator is `Exists` (an empty key then matches every key) or the keys
//! and values are equal (`Equal`, the default). For provisioning, every taint a node would carry
//! must be tolerated, `PreferNoSchedule` included: Karpenter treats preferences as requirements and
//! only relaxes them when nothing else fits.

use k8s_openapi::api::core::v1::{Taint, Toleration};

/// True when `toleration` tolerates `taint`.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect_ok = toleration
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    if !effect_ok {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    match toleration.operator.as_deref() {
        Some("Exists") => key.is_empty() || key == taint.key,
        // `Equal` is the default operator.
        _ => {
            key == taint.key
                && toleration.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
    }
}

/// The first of `taints` that none of `tolerations` tolerates, if any.
pub fn first_untolerated<'a>(tolerations: &[Toleration], taints: &'a [Taint]) -> Option<&'a Taint> {
    taints
        .iter()
        .find(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
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
        Toleration {
            key: key.map(Into::into),
            operator: operator.map(Into::into),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            toleration_seconds: None,
        }
    }

    #[test]
    fn equal_needs_key_and_value() {
        let gpu = taint("nvidia.com/gpu", Some("true"), "NoSchedule");
        assert!(tolerates(
            &toleration(Some("nvidia.com/gpu"), None, Some("true"), None),
            &gpu
        ));
        assert!(!tolerates(
            &toleration(Some("nvidia.com/gpu"), Some("Equal"), Some("false"), None),
            &gpu
        ));
        assert!(!tolerates(
            &toleration(Some("other"), None, Some("true"), None),
            &gpu
        ));
    }

    #[test]
    fn exists_ignores_the_value_and_an_empty_key_matches_all() {
        let gpu = taint("nvidia.com/gpu", Some("true"), "NoSchedule");
        assert!(tolerates(
            &toleration(Some("nvidia.com/gpu"), Some("Exists"), None, None),
            &gpu
        ));
        assert!(tolerates(&toleration(None, Some("Exists"), None, None), &gpu));
        assert!(
            !tolerates(&toleration(None, None, None, None), &gpu),
            "empty key with Equal matches nothing"
        );
    }

    #[test]
    fn effects_must_agree_unless_the_toleration_has_none() {
        let t = taint("dedicated", Some("batch"), "NoExecute");
        assert!(!tolerates(
            &toleration(Some("dedicated"), None, Some("batch"), Some("NoSchedule")),
            &t
        ));
        assert!(tolerates(
            &toleration(Some("dedicated"), None, Some("batch"), Some("NoExecute")),
            &t
        ));
    }

    #[test]
    fn reports_the_first_untolerated_taint() {
        let taints = [
            taint("a", None, "NoSchedule"),
            taint("b", None, "PreferNoSchedule"),
        ];
        let tols = [toleration(Some("a"), Some("Exists"), None, None)];
        assert_eq!(
            first_untolerated(&tols, &taints).map(|t| t.key.as_str()),
            Some("b")
        );
        assert_eq!(
            first_untolerated(&[toleration(None, Some("Exists"), None, None)], &taints),
            None
        );
    }
}
