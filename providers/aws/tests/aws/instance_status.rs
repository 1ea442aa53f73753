//! EC2's status checks read as Karpenter reads them, at a fake EC2 endpoint ([`super::fake_ec2`]):
//! moto answers DescribeInstanceStatus but implements none of its status or event filters. Three
//! calls, one per filter, every page followed, an instance two of them return kept once, and a
//! missing permission told apart from other failures.

use joist_provider::{
    CloudError,
    instance_status::{InstanceHealth, StatusCategory, StatusCheck},
};
use joist_provider_aws::instance_status;

use super::fake_ec2;

/// One `instanceStatusSet` item: its status summaries and events, as EC2 writes them.
fn status(id: &str, instance: &str, system: &str, events: &str) -> String {
    format!(
        "<item><instanceId>{id}</instanceId><availabilityZone>us-west-2a</availabilityZone>\
         <instanceState><code>16</code><name>running</name></instanceState>\
         <instanceStatus>{instance}</instanceStatus><systemStatus>{system}</systemStatus>\
         <eventsSet>{events}</eventsSet></item>"
    )
}

/// A summary with one reachability detail.
fn summary(status: &str, detail: &str, since: &str) -> String {
    let since = if since.is_empty() {
        String::new()
    } else {
        format!("<impairedSince>{since}</impairedSince>")
    };
    format!(
        "<status>{status}</status><details><item><name>reachability</name><status>{detail}</status>{since}</item></details>"
    )
}

fn reply(items: &[String], next: Option<&str>) -> (u16, String) {
    fake_ec2::page("DescribeInstanceStatus", "instanceStatusSet", items, next)
}

/// i-a has both checks failing (the first two calls return it), i-b a failing system check on
/// the second page of the system call, i-c scheduled maintenance.
fn answer(body: &str) -> (u16, String) {
    let ok = summary("ok", "passed", "");
    let impaired = summary("impaired", "failed", "2026-01-01T00:00:00.000Z");
    let both = status("i-a", &impaired, &impaired, "");
    if body.contains("Filter.1.Name=instance-status.status") {
        return reply(&[both], None);
    }
    if body.contains("Filter.1.Name=system-status.status") {
        if body.contains("NextToken=page2") {
            return reply(&[status("i-b", &ok, &impaired, "")], None);
        }
        return reply(&[both], Some("page2"));
    }
    if body.contains("Filter.1.Name=event.code") {
        let event = "<item><code>system-maintenance</code><description>d</description>\
                     <notBefore>2026-02-01T00:00:00.000Z</notBefore></item>";
        return reply(&[status("i-c", &ok, &ok, event)], None);
    }
    (400, "<Response><Errors><Error><Code>InvalidParameterValue</Code><Message>unexpected</Message></Error></Errors></Response>".into())
}

fn check(category: StatusCategory, name: &str, failed: bool, since: Option<i64>) -> StatusCheck {
    StatusCheck {
        category,
        name: name.into(),
        failed,
        impaired_since: since,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impaired_instances_are_read_with_one_call_per_filter_and_every_page() {
    let (clients, seen) = fake_ec2::serve(answer).await;
    let reported = instance_status::impaired(&clients)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let since = Some(1_767_225_600);
    assert_eq!(
        reported,
        [
            InstanceHealth {
                instance_id: "i-a".into(),
                checks: vec![
                    check(StatusCategory::Instance, "reachability", true, since),
                    check(StatusCategory::System, "reachability", true, since),
                ],
            },
            InstanceHealth {
                instance_id: "i-b".into(),
                checks: vec![
                    check(StatusCategory::Instance, "reachability", false, None),
                    check(StatusCategory::System, "reachability", true, since),
                ],
            },
            InstanceHealth {
                instance_id: "i-c".into(),
                checks: vec![
                    check(StatusCategory::Instance, "reachability", false, None),
                    check(StatusCategory::System, "reachability", false, None),
                    check(StatusCategory::Event, "system-maintenance", true, None),
                ],
            },
        ]
    );
    let requests = fake_ec2::seen(&seen);
    assert_eq!(
        requests.len(),
        4,
        "three filters, one of them two pages: {requests:#?}"
    );
    let events = &requests[3];
    for code in [
        "instance-reboot",
        "system-reboot",
        "system-maintenance",
        "instance-retirement",
        "instance-stop",
    ] {
        assert!(events.contains(&format!("={code}")), "{code} in {events}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_permission_is_not_permitted_rather_than_a_failed_call() {
    let (clients, _) = fake_ec2::serve(|_| {
        (
            403,
            "<Response><Errors><Error><Code>UnauthorizedOperation</Code>\
             <Message>You are not authorized to perform this operation.</Message></Error></Errors>\
             <RequestID>r</RequestID></Response>"
                .into(),
        )
    })
    .await;
    let refused = instance_status::impaired(&clients).await;
    assert!(
        matches!(&refused, Err(CloudError::NotPermitted { operation, .. }) if operation == "DescribeInstanceStatus"),
        "{refused:?}"
    );
}
