//! Every CRD field fuzzed through `joist validate`'s checks: whatever a user writes in any field,
//! the verdict is a list of one-line problems each naming a field (a value of the wrong type is
//! named on its own field), never a panic; and whatever the API server would store (the CRD's
//! schema and CEL rules accept it) decodes into Joist's types, so the controllers can read it.

use std::{
    collections::HashMap,
    sync::{LazyLock, Mutex},
};

use joist_messages::apis::{
    CapacityBuffer, EC2NodeClass, NodeClaim, NodeOverlay, NodePool,
    manifest::{Checker, Outcome},
};
use proptest::{prelude::*, sample::Index};
use serde_json::Value;

use super::crd_verdict;
use crate::fixtures::{applied, valid_by_kind};
use crate::mutants::{Field, Mutant, fields, mutant, schemas};

static FIELDS: LazyLock<Vec<Field>> = LazyLock::new(fields);

/// The valid fixtures' Karpenter objects, by kind: the documents the fuzz starts from.
static BASES: LazyLock<HashMap<String, Vec<Value>>> = LazyLock::new(valid_by_kind);

static SCHEMAS: LazyLock<HashMap<String, Value>> = LazyLock::new(schemas);

static CHECKER: LazyLock<Mutex<Checker>> = LazyLock::new(|| Mutex::new(Checker::new()));

/// A base object of the mutant's kind with the mutant applied.
fn fuzzed(mutant: &Mutant, pick: &Index) -> Value {
    applied(&BASES, mutant, pick)
}

/// Why Joist's types cannot hold `document`, if they cannot.
fn undecodable(document: &Value) -> Option<String> {
    fn decode<T: serde::de::DeserializeOwned>(document: &Value) -> Option<String> {
        serde_path_to_error::deserialize::<_, T>(document)
            .err()
            .map(|e| e.to_string())
    }
    match document["kind"].as_str() {
        Some("NodePool") => decode::<NodePool>(document),
        Some("NodeClaim") => decode::<NodeClaim>(document),
        Some("EC2NodeClass") => decode::<EC2NodeClass>(document),
        Some("NodeOverlay") => decode::<NodeOverlay>(document),
        Some("CapacityBuffer") => decode::<CapacityBuffer>(document),
        other => Some(format!("no type for kind {other:?}")),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 768, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_fuzzed_field_gets_one_line_problems_naming_fields(
        mutant in mutant(&FIELDS, None),
        pick in any::<Index>(),
    ) {
        let document = fuzzed(&mutant, &pick);
        let path = mutant.field.path();
        let verdict = CHECKER
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .check_document(&document);
        match verdict.outcome {
            Outcome::Valid(_) => prop_assert!(!mutant.wrong, "{path} = {} was accepted", mutant.value),
            Outcome::Invalid(problems) => {
                for problem in &problems {
                    prop_assert!(!problem.field.is_empty() && !problem.message.is_empty(), "{problem:?}");
                    prop_assert!(!problem.to_string().contains('\n'), "not one line: {problem}");
                }
                prop_assert!(
                    !mutant.wrong || problems.iter().any(|p| p.field == path),
                    "{path} = {}: {problems:?}", mutant.value
                );
            }
            other => prop_assert!(false, "{path}: {other:?}"),
        }
    }

    #[test]
    fn whatever_the_crd_accepts_decodes_into_joists_types(
        mutant in mutant(&FIELDS, None),
        pick in any::<Index>(),
    ) {
        let document = fuzzed(&mutant, &pick);
        if crd_verdict(&SCHEMAS, &document).is_empty() {
            let path = mutant.field.path();
            prop_assert_eq!(undecodable(&document), None, "{} = {}", path, mutant.value);
        }
    }
}
