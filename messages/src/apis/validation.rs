//! Field-level validation results shared by every API type.
//!
//! Each API type's `validate()` returns all its [`Violation`]s at once, each naming the field by its
//! path from the object root (`spec.template.spec.requirements[0].values`), so a controller can put
//! them in a `ValidationSucceeded=False` condition and `joist validate` can print them.

use std::fmt;

/// One broken rule: the field path and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Path of the field from the object root.
    pub field: String,
    /// What is wrong, in words a user can act on.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Collects violations under a path prefix.
#[derive(Debug, Default)]
pub struct Violations(Vec<Violation>);

impl Violations {
    /// Records that `field` breaks a rule.
    pub fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Violation {
            field: field.into(),
            message: message.into(),
        });
    }

    /// Records a missing or empty `metadata.name` of a `kind` object.
    pub fn require_name(&mut self, name: Option<&str>, kind: &str) {
        if name.is_none_or(str::is_empty) {
            self.push("metadata.name", format!("a {kind} needs a name"));
        }
    }

    /// The collected violations, in the order found.
    pub fn into_vec(self) -> Vec<Violation> {
        self.0
    }
}

/// An API object that can check itself against the v1 contract.
pub trait Validate {
    /// Every rule the object breaks; empty when valid.
    fn validate(&self) -> Vec<Violation>;

    /// Every rule `document`, an object of this kind as written, breaks where the typed object
    /// cannot tell (a map written empty is no map once typed, where a CRD's CEL `has()` sees it
    /// set); none by default.
    fn validate_written(_document: &serde_json::Value) -> Vec<Violation> {
        Vec::new()
    }
}
