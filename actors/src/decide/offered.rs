//! A NodePool's instance types for one pass, found by name without a scan: the disruption pass
//! looks up every NodeClaim's type (its price, whether it is still offered), so a scan of the
//! catalog per claim would make the pass grow with claims times types. Cannot fail; a name not
//! offered is `None`.

use std::{collections::HashMap, sync::Arc};

use joist_messages::model::instance_type::InstanceType;

/// See the module docs.
#[derive(Debug, Default)]
pub struct Offered<'a> {
    by_name: HashMap<&'a str, &'a InstanceType>,
}

impl<'a> Offered<'a> {
    /// The types of `types`, by name.
    pub fn new(types: &'a [Arc<InstanceType>]) -> Self {
        Self {
            by_name: types.iter().map(|it| (it.name.as_str(), it.as_ref())).collect(),
        }
    }

    /// The type called `name`, if offered.
    pub fn get(&self, name: &str) -> Option<&'a InstanceType> {
        self.by_name.get(name).copied()
    }

    /// Whether nothing is offered (a catalog not known yet).
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}
