//! Property tests of the domain model: exact quantity parsing and the requirement algebra.

use joist_messages::model::{
    quantity::Quantity,
    requirements::{Operator, Requirement, Requirements},
};
use proptest::prelude::*;

/// A small value domain so sets overlap often; numbers exercise the Gt/Lt bounds.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a"),
        Just("b"),
        Just("c"),
        Just("1"),
        Just("2"),
        Just("5"),
        Just("9")
    ]
    .prop_map(String::from)
}

fn requirement() -> impl Strategy<Value = Requirement> {
    let operator = prop_oneof![
        Just(Operator::In),
        Just(Operator::NotIn),
        Just(Operator::Exists),
        Just(Operator::DoesNotExist),
        Just(Operator::Gt),
        Just(Operator::Lt),
        Just(Operator::Gte),
        Just(Operator::Lte),
    ];
    (operator, proptest::collection::btree_set(value(), 1..4), 0i64..10).prop_map(|(op, values, bound)| {
        let values: Vec<String> = match op {
            Operator::Gt | Operator::Lt | Operator::Gte | Operator::Lte => vec![bound.to_string()],
            Operator::Exists | Operator::DoesNotExist => vec![],
            Operator::In | Operator::NotIn => values.into_iter().collect(),
        };
        Requirement::new("k", op, values).unwrap_or_else(|e| panic!("{e}"))
    })
}

/// Every value the domain can produce, plus ones it never names.
const PROBES: &[&str] = &["a", "b", "c", "d", "0", "1", "2", "3", "5", "9", "10", "-1"];

proptest! {
    #[test]
    fn intersection_is_commutative(a in requirement(), b in requirement()) {
        prop_assert_eq!(a.intersection(&b), b.intersection(&a));
    }

    #[test]
    fn intersection_is_associative(a in requirement(), b in requirement(), c in requirement()) {
        prop_assert_eq!(a.intersection(&b).intersection(&c), a.intersection(&b.intersection(&c)));
    }

    #[test]
    fn intersection_is_idempotent(a in requirement()) {
        prop_assert_eq!(a.intersection(&a), a.clone());
    }

    #[test]
    fn membership_of_an_intersection_is_membership_of_both(a in requirement(), b in requirement()) {
        let both = a.intersection(&b);
        for v in PROBES {
            prop_assert_eq!(both.has(v), a.has(v) && b.has(v), "value {} in {} ∩ {} = {}", v, a, b, both);
        }
    }

    #[test]
    fn overlaps_agrees_with_a_non_empty_intersection(a in requirement(), b in requirement()) {
        prop_assert_eq!(a.overlaps(&b), !a.intersection(&b).is_empty(), "{} and {}", a, b);
    }

    #[test]
    fn an_in_set_intersected_with_its_not_in_is_empty(values in proptest::collection::btree_set(value(), 1..4)) {
        let r#in = Requirement::new("k", Operator::In, values.iter().cloned()).unwrap_or_else(|e| panic!("{e}"));
        let not_in = Requirement::new("k", Operator::NotIn, values.iter().cloned()).unwrap_or_else(|e| panic!("{e}"));
        prop_assert!(r#in.intersection(&not_in).is_empty());
    }

    #[test]
    fn requirements_intersect_symmetrically(a in requirement(), b in requirement()) {
        let ra: Requirements = [a].into_iter().collect();
        let rb: Requirements = [b].into_iter().collect();
        prop_assert_eq!(ra.intersects(&rb).is_ok(), rb.intersects(&ra).is_ok());
    }

    #[test]
    fn a_label_value_matches_exactly_when_the_requirement_has_it(a in requirement(), v in value()) {
        let reqs: Requirements = [a.clone()].into_iter().collect();
        prop_assert_eq!(reqs.matches_labels(|_| Some(v.as_str())), a.has(&v));
    }

    #[test]
    fn requirements_survive_their_wire_form(a in requirement(), b in requirement()) {
        let reqs: Requirements = [a, b].into_iter().collect();
        let json = serde_json::to_string(&reqs).unwrap_or_default();
        let back: Requirements = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
        prop_assert_eq!(back, reqs);
    }

    #[test]
    fn integers_with_decimal_suffixes_parse_exactly(n in 0i64..1_000_000, suffix in prop_oneof![
        Just(("", 1000i64)), Just(("m", 1)), Just(("k", 1_000_000)), Just(("Ki", 1_024_000)), Just(("Mi", 1_048_576_000))
    ]) {
        let q: Quantity = format!("{n}{}", suffix.0).parse().unwrap_or_else(|e| panic!("{e}"));
        prop_assert_eq!(q.millis(), n * suffix.1);
    }

    #[test]
    fn decimals_are_exact_to_the_milli(whole in 0i64..100_000, frac in 0u32..1000) {
        let text = format!("{whole}.{frac:03}");
        let q: Quantity = text.parse().unwrap_or_else(|e| panic!("{e}"));
        prop_assert_eq!(q.millis(), whole * 1000 + i64::from(frac));
    }

    #[test]
    fn exponents_equal_their_expansion(mantissa in 0i64..1000, exp in 0u32..6) {
        let a: Quantity = format!("{mantissa}e{exp}").parse().unwrap_or_else(|e| panic!("{e}"));
        let b: Quantity = format!("{}", mantissa * 10i64.pow(exp)).parse().unwrap_or_else(|e| panic!("{e}"));
        prop_assert_eq!(a, b);
    }

    #[test]
    fn display_round_trips(millis in -1_000_000_000i64..1_000_000_000) {
        let q = Quantity::from_millis(millis);
        prop_assert_eq!(q.to_string().parse::<Quantity>(), Ok(q));
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,12}") {
        let _ = text.parse::<Quantity>();
    }
}
