//! EC2's instance status checks: the instances whose instance or system check is impaired, or
//! that have a scheduled reboot, maintenance, retirement or stop, read with DescribeInstanceStatus
//! as Karpenter's AWS provider reads them.
//!
//! EC2 ANDs the filters of one call, so the three conditions are three calls (every page followed),
//! and an instance more than one of them returns is kept once. Checks of attached EBS volumes are
//! not read (see [`joist_provider::instance_status`]). An `UnauthorizedOperation` (the role lacks
//! `ec2:DescribeInstanceStatus`) is [`CloudError::NotPermitted`]; any other failure converts as
//! every EC2 error does ([`AwsError`]).

use std::collections::BTreeSet;

use aws_sdk_ec2::types::{Filter, InstanceStatus, InstanceStatusDetails, StatusType};
use joist_provider::{
    CloudError,
    instance_status::{EVENT_CODES, InstanceHealth, StatusCategory, StatusCheck},
};

use crate::{clients::AwsClients, error::AwsError};

const OPERATION: &str = "DescribeInstanceStatus";

/// The filter of each call: impaired instance checks, impaired system checks, scheduled events.
fn filter_sets() -> [Filter; 3] {
    let impaired = |name: &str| Filter::builder().name(name).values("impaired").build();
    [
        impaired("instance-status.status"),
        impaired("system-status.status"),
        Filter::builder()
            .name("event.code")
            .set_values(Some(EVENT_CODES.map(str::to_owned).to_vec()))
            .build(),
    ]
}

/// Every instance of the account and region EC2 reports as impaired or with a scheduled event.
pub async fn impaired(clients: &AwsClients) -> Result<Vec<InstanceHealth>, CloudError> {
    let mut seen = BTreeSet::new();
    let mut reported = Vec::new();
    for filter in filter_sets() {
        let statuses: Vec<InstanceStatus> = clients
            .ec2
            .describe_instance_status()
            .filters(filter)
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(|e| refused(AwsError::api(OPERATION, e.into_service_error())))?;
        for status in statuses {
            if let Some(health) = health(&status)
                && seen.insert(health.instance_id.clone())
            {
                reported.push(health);
            }
        }
    }
    Ok(reported)
}

/// A missing permission as such; anything else as every EC2 error converts.
fn refused(error: AwsError) -> CloudError {
    if error.code() == Some("UnauthorizedOperation") {
        return CloudError::NotPermitted {
            operation: OPERATION.to_owned(),
            message: error.to_string(),
        };
    }
    error.into()
}

/// The neutral view of one instance's status; `None` without an instance id.
fn health(status: &InstanceStatus) -> Option<InstanceHealth> {
    let summary = |details: &[InstanceStatusDetails], category| {
        details
            .iter()
            .map(|detail| StatusCheck {
                category,
                name: detail.name().map(|n| n.as_str().to_owned()).unwrap_or_default(),
                failed: detail.status() == Some(&StatusType::Failed),
                impaired_since: detail.impaired_since().map(|t| t.secs()),
            })
            .collect::<Vec<_>>()
    };
    let mut checks = Vec::new();
    if let Some(instance) = status.instance_status() {
        checks.extend(summary(instance.details(), StatusCategory::Instance));
    }
    if let Some(system) = status.system_status() {
        checks.extend(summary(system.details(), StatusCategory::System));
    }
    checks.extend(status.events().iter().map(|event| StatusCheck {
        category: StatusCategory::Event,
        name: event.code().map(|c| c.as_str().to_owned()).unwrap_or_default(),
        failed: true,
        impaired_since: None,
    }));
    Some(InstanceHealth {
        instance_id: status.instance_id()?.to_owned(),
        checks,
    })
}
