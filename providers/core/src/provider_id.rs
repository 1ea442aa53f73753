//! Provider IDs: the `spec.providerID` a Node and its NodeClaim carry for the instance behind them
//! (`aws:///us-west-2a/i-0abc`, `kwok://…`). One reading of them for every cloud and the actors.

/// The instance id a provider ID ends with, its last path segment (`aws:///us-west-2a/i-0abc` →
/// `i-0abc`); the whole text when it has no `/`.
pub fn instance_id(provider_id: &str) -> &str {
    provider_id.rsplit('/').next().unwrap_or(provider_id)
}

#[cfg(test)]
mod tests {
    use super::instance_id;

    #[test]
    fn the_instance_id_is_the_last_segment() {
        assert_eq!(instance_id("aws:///us-west-2a/i-0abc"), "i-0abc");
        assert_eq!(instance_id("kwok://i-0abc"), "i-0abc");
        assert_eq!(instance_id("i-0abc"), "i-0abc");
    }
}
