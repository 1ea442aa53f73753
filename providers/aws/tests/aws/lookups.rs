//! Instance lookups by id are coalesced: lookups made together go out as one DescribeInstances
//! call (counted at a fake EC2 endpoint, [`super::fake_ec2`]), and one id EC2 does not know fails
//! only its own lookup.

use joist_provider::CloudError;
use joist_provider_aws::instances;

use super::fake_ec2;

/// The instance ids a DescribeInstances request asks for.
fn asked(body: &str) -> Vec<String> {
    body.split('&')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(key, _)| key.starts_with("InstanceId."))
        .map(|(_, id)| id.to_owned())
        .collect()
}

/// Describes every asked id as a running m5.large (in partition 2 of a placement group when its id
/// ends in `p2`), unless one of them is `i-unknown`: then EC2's error for the whole call.
fn answer(body: &str) -> (u16, String) {
    let ids = asked(body);
    if ids.iter().any(|id| id == "i-unknown") {
        return (
            400,
            "<Response><Errors><Error><Code>InvalidInstanceID.NotFound</Code>\
             <Message>The instance ID 'i-unknown' does not exist</Message></Error></Errors>\
             <RequestID>r</RequestID></Response>"
                .to_owned(),
        );
    }
    let items: String = ids
        .iter()
        .map(|id| {
            let partition = if id.ends_with("p2") {
                "<groupId>pg-1</groupId><partitionNumber>2</partitionNumber>"
            } else {
                ""
            };
            format!(
                "<item><reservationId>r-{id}</reservationId><instancesSet><item><instanceId>{id}</instanceId>\
                 <imageId>ami-1</imageId><instanceState><code>16</code><name>running</name></instanceState>\
                 <instanceType>m5.large</instanceType><placement><availabilityZone>us-west-2a</availabilityZone>\
                 {partition}</placement></item></instancesSet></item>"
            )
        })
        .collect();
    (
        200,
        format!(
            "<DescribeInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">\
             <requestId>r</requestId><reservationSet>{items}</reservationSet></DescribeInstancesResponse>"
        ),
    )
}

fn provider_id(id: &str) -> String {
    instances::provider_id("us-west-2a", id)
}

/// Looks the instances `ids` up at once, each on its own: the provider ID each lookup found.
async fn look_up_together(
    lookups: &instances::Lookups,
    ids: &[impl AsRef<str>],
) -> Vec<Result<String, CloudError>> {
    futures::future::join_all(ids.iter().map(|id| async move {
        let instance = instances::get(lookups, &provider_id(id.as_ref())).await;
        instance.map(|i| i.provider_id)
    }))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_made_together_are_one_describe_instances_call() {
    let (clients, seen) = fake_ec2::serve(answer).await;
    let lookups = instances::lookups(clients);
    let ids: Vec<String> = (0..40).map(|n| format!("i-{n:017x}")).collect();
    let found = look_up_together(&lookups, &ids).await;
    let expected: Vec<Result<String, CloudError>> = ids.iter().map(|id| Ok(provider_id(id))).collect();
    assert_eq!(found, expected, "each lookup gets its own instance");
    let requests = fake_ec2::seen(&seen);
    assert_eq!(requests.len(), 1, "{requests:#?}");
    let mut asked = asked(&requests[0]);
    asked.sort();
    assert_eq!(asked, ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_id_fails_only_its_own_lookup() {
    let (clients, seen) = fake_ec2::serve(answer).await;
    let lookups = instances::lookups(clients);
    let ids = ["i-0000000000000000a", "i-unknown", "i-0000000000000000b"];
    let found = look_up_together(&lookups, &ids).await;
    assert!(
        matches!(
            &found[..],
            [Ok(a), Err(CloudError::NodeClaimNotFound { provider_id }), Ok(b)]
                if *a == self::provider_id(ids[0]) && *provider_id == self::provider_id("i-unknown")
                    && *b == self::provider_id(ids[2])
        ),
        "{found:?}"
    );
    assert_eq!(
        fake_ec2::seen(&seen).len(),
        4,
        "the call for all, then one for each id"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instances_placement_says_its_partition_when_it_has_one() {
    let (clients, _) = fake_ec2::serve(answer).await;
    let lookups = instances::lookups(clients);
    let partition = |id: &'static str| {
        let lookups = &lookups;
        async move {
            instances::placement(lookups, &provider_id(id))
                .await
                .map(|p| p.partition)
                .unwrap_or_else(|e| panic!("{e}"))
        }
    };
    assert_eq!(partition("i-00000000000000p2").await, Some(2));
    assert_eq!(partition("i-000000000000000a").await, None);
}
