//! Placement groups read as Karpenter reads them, at a fake EC2 endpoint ([`super::fake_ec2`]):
//! moto 5.2.1 implements no placement group call. A selector asks by id (`GroupIds`) or by name
//! (`GroupNames`), only for `available` groups; each strategy reads back with a partition group's
//! count; a group EC2 does not know is none found, and any other refusal is an error.

use joist_messages::apis::ec2nodeclass::PlacementGroupSelector;
use joist_provider::placement_group::Strategy;
use joist_provider_aws::placement_groups;

use super::fake_ec2;

fn group(id: &str, name: &str, strategy: &str, partitions: Option<u32>) -> String {
    let partitions = partitions
        .map(|n| format!("<partitionCount>{n}</partitionCount>"))
        .unwrap_or_default();
    format!(
        "<item><groupName>{name}</groupName><groupId>{id}</groupId><state>available</state>\
         <strategy>{strategy}</strategy>{partitions}</item>"
    )
}

/// `kafka` (by name) is a partition group, `pg-0hpc` (by id) a cluster group, `apart` a spread
/// group; `gone` is unknown and `denied` is refused.
fn answer(body: &str) -> (u16, String) {
    let reply =
        |items: &[String]| fake_ec2::page("DescribePlacementGroups", "placementGroupSet", items, None);
    let error = |code: &str| {
        (
            400,
            format!(
                "<Response><Errors><Error><Code>{code}</Code><Message>no</Message></Error></Errors></Response>"
            ),
        )
    };
    if !body.contains("Filter.1.Name=state&Filter.1.Value.1=available") {
        return error("InvalidParameterValue");
    }
    if body.contains("GroupName.1=kafka") {
        return reply(&[group("pg-0kafka", "kafka", "partition", Some(3))]);
    }
    if body.contains("GroupId.1=pg-0hpc") {
        return reply(&[group("pg-0hpc", "hpc", "cluster", None)]);
    }
    if body.contains("GroupName.1=apart") {
        return reply(&[group("pg-0apart", "apart", "spread", None)]);
    }
    if body.contains("GroupName.1=gone") {
        return error("InvalidPlacementGroup.Unknown");
    }
    error("UnauthorizedOperation")
}

fn by_name(name: &str) -> PlacementGroupSelector {
    PlacementGroupSelector {
        name: Some(name.into()),
        id: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_reads_its_available_group_by_name_or_id_with_its_strategy() {
    let (clients, seen) = fake_ec2::serve(answer).await;
    let kafka = placement_groups::describe(&clients, &by_name("kafka")).await;
    let kafka = kafka
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("kafka"));
    assert_eq!(
        (kafka.id.as_str(), kafka.strategy),
        ("pg-0kafka", Strategy::Partition { partitions: 3 })
    );
    let by_id = PlacementGroupSelector {
        name: None,
        id: Some("pg-0hpc".into()),
    };
    let hpc = placement_groups::describe(&clients, &by_id).await;
    let hpc = hpc
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("hpc"));
    assert_eq!((hpc.name.as_str(), hpc.strategy), ("hpc", Strategy::Cluster));
    let apart = placement_groups::describe(&clients, &by_name("apart")).await;
    assert_eq!(
        apart.unwrap_or_else(|e| panic!("{e}")).map(|g| g.strategy),
        Some(Strategy::Spread)
    );
    let asked = fake_ec2::seen(&seen);
    assert!(
        asked
            .iter()
            .all(|b| b.starts_with("Action=DescribePlacementGroups")),
        "{asked:?}"
    );
    assert!(
        !asked.iter().any(|b| b.contains("GroupName.1=pg-0hpc")),
        "an id is asked as an id"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_group_is_none_found_and_a_refusal_is_an_error() {
    let (clients, _) = fake_ec2::serve(answer).await;
    let gone = placement_groups::describe(&clients, &by_name("gone")).await;
    assert!(matches!(gone, Ok(None)), "{gone:?}");
    let denied = placement_groups::describe(&clients, &by_name("denied")).await;
    let denied = denied.map(|_| ()).map_err(|e| e.to_string());
    assert!(
        denied
            .as_ref()
            .is_err_and(|e| e.starts_with("DescribePlacementGroups")),
        "{denied:?}"
    );
}
