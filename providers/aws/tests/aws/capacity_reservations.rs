//! Capacity reservations read as Karpenter reads them, at a fake EC2 endpoint
//! ([`super::fake_ec2`]): moto implements no EC2 capacity reservation call. One call per term
//! (only active reservations, every page), an id EC2 does not know is no reservation, a
//! reservation two terms select is kept once, an ended one and one of an unknown kind are left
//! out, and a capacity block is `expiring` from 40 minutes before its end.

use joist_messages::apis::ec2nodeclass::{
    CapacityReservationSelectorTerm, InstanceMatchCriteria, ReservationState, ReservationType,
};
use joist_provider_aws::capacity_reservations;

use super::fake_ec2;

/// 2026-01-01T00:00:00Z.
const NOW: i64 = 1_767_225_600;

/// One `capacityReservationSet` item.
fn item(id: &str, kind: &str, end: &str, available: u32) -> String {
    let end = if end.is_empty() {
        String::new()
    } else {
        format!("<endDate>{end}</endDate>")
    };
    format!(
        "<item><capacityReservationId>{id}</capacityReservationId><ownerId>123456789012</ownerId>\
         <instanceType>m5.large</instanceType><availabilityZone>us-west-2a</availabilityZone>\
         <availableInstanceCount>{available}</availableInstanceCount><totalInstanceCount>4</totalInstanceCount>\
         <state>active</state><instanceMatchCriteria>targeted</instanceMatchCriteria>\
         <reservationType>{kind}</reservationType>{end}</item>"
    )
}

fn reply(items: &[String], next: Option<&str>) -> (u16, String) {
    fake_ec2::page(
        "DescribeCapacityReservations",
        "capacityReservationSet",
        items,
        next,
    )
}

/// `cr-gone` is unknown; the tag query returns `cr-odcr` and, on its second page, a capacity
/// block ending in 30 minutes, one that ended, and one of a type Joist does not know.
fn answer(body: &str) -> (u16, String) {
    if body.contains("CapacityReservationId.1=cr-gone") {
        return (
            400,
            "<Response><Errors><Error><Code>InvalidCapacityReservationId.NotFound</Code><Message>no</Message></Error></Errors></Response>".into(),
        );
    }
    if body.contains("CapacityReservationId.1=cr-odcr") {
        return reply(&[item("cr-odcr", "default", "", 3)], None);
    }
    if body.contains("tag%3Ateam") {
        if body.contains("NextToken=page2") {
            return reply(
                &[
                    item("cr-block", "capacity-block", "2026-01-01T00:30:00.000Z", 1),
                    item("cr-ended", "default", "2025-12-31T00:00:00.000Z", 1),
                    item("cr-odd", "something-new", "", 1),
                ],
                None,
            );
        }
        return reply(&[item("cr-odcr", "default", "", 3)], Some("page2"));
    }
    (400, "<Response><Errors><Error><Code>InvalidParameterValue</Code><Message>unexpected</Message></Error></Errors></Response>".into())
}

fn term(id: Option<&str>, tags: &[(&str, &str)]) -> CapacityReservationSelectorTerm {
    CapacityReservationSelectorTerm {
        tags: tags.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(),
        id: id.map(Into::into),
        owner_id: None,
        instance_match_criteria: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selected_reservations_are_described_once_each_with_their_room_and_state() {
    let (clients, seen) = fake_ec2::serve(answer).await;
    let terms = [
        term(Some("cr-gone"), &[]),
        term(Some("cr-odcr"), &[]),
        term(None, &[("team", "ml")]),
        term(None, &[]),
    ];
    let found = capacity_reservations::describe(&clients, &terms, NOW)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let summary: Vec<(&str, ReservationType, ReservationState, u32)> = found
        .iter()
        .map(|(r, room)| (r.id.as_str(), r.reservation_type, r.state, *room))
        .collect();
    assert_eq!(
        summary,
        [
            (
                "cr-block",
                ReservationType::CapacityBlock,
                ReservationState::Expiring,
                1
            ),
            ("cr-odcr", ReservationType::Default, ReservationState::Active, 3),
        ]
    );
    let block = &found[0].0;
    assert_eq!(block.instance_match_criteria, InstanceMatchCriteria::Targeted);
    assert_eq!(
        block.end_time.as_ref().map(|t| t.0.as_second()),
        Some(NOW + 30 * 60)
    );
    let requests = fake_ec2::seen(&seen);
    assert_eq!(
        requests.len(),
        4,
        "two ids, one query of two pages, none for the empty term: {requests:#?}"
    );
    assert!(
        requests
            .iter()
            .all(|r| r.contains("Filter.1.Name=state") && r.contains("Filter.1.Value.1=active")),
        "{requests:#?}"
    );
}

/// A CreateFleet answer: one instance of m5.large in us-west-2a, billed as on-demand.
fn fleet_answer(_: &str) -> (u16, String) {
    (
        200,
        "<CreateFleetResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>r</requestId>\
         <fleetId>fleet-1</fleetId><errorSet/><fleetInstanceSet><item><launchTemplateAndOverrides>\
         <launchTemplateSpecification><launchTemplateName>t</launchTemplateName><version>1</version></launchTemplateSpecification>\
         <overrides><instanceType>m5.large</instanceType><subnetId>subnet-1</subnetId><availabilityZone>us-west-2a</availabilityZone></overrides>\
         </launchTemplateAndOverrides><lifecycle>on-demand</lifecycle><instanceIds><item>i-1</item></instanceIds>\
         <instanceType>m5.large</instanceType></item></fleetInstanceSet></CreateFleetResponse>"
            .into(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_of_reservation_is_launched_as_ec2_sells_it() {
    use joist_messages::model::instance_type::CapacityType;
    use joist_provider_aws::fleet::{self, FleetRequest, Override, TemplateConfig};
    let (clients, seen) = fake_ec2::serve(fleet_answer).await;
    let request = |reservation| FleetRequest {
        capacity_type: CapacityType::Reserved,
        reservation: Some(reservation),
        prioritized: false,
        placement_group: None,
        configs: vec![TemplateConfig {
            template: "t".into(),
            overrides: vec![Override {
                instance_type: "m5.large".into(),
                subnet_id: "subnet-1".into(),
                zone: "us-west-2a".into(),
                priority: 0,
            }],
        }],
        tags: Default::default(),
    };
    let kinds = [
        ((ReservationType::Default, false), "on-demand"),
        ((ReservationType::CapacityBlock, false), "capacity-block"),
        ((ReservationType::Default, true), "reserved-capacity"),
    ];
    for (reservation, target) in kinds {
        let outcome = fleet::create(&clients, &request(reservation), 1)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            outcome.launched.first().map(|l| l.offering.capacity_type),
            Some(CapacityType::Reserved),
            "billed as on-demand, bought as reserved: {outcome:?}"
        );
        let body = fake_ec2::seen(&seen).pop().unwrap_or_default();
        assert!(
            body.contains(&format!(
                "TargetCapacitySpecification.DefaultTargetCapacityType={target}"
            )),
            "{reservation:?}: {body}"
        );
        assert_eq!(body.contains("OnDemandOptions"), target == "on-demand", "{body}");
        assert_eq!(
            body.contains("ReservedCapacityOptions.ReservationType.1=interruptible-capacity-reservation"),
            target == "reserved-capacity",
            "{body}"
        );
    }
}
