//! Pagination at the SDK boundary. moto answers every describe call in one page whatever
//! `MaxResults` says, so following `NextToken` is tested here against a fake EC2 endpoint
//! ([`super::fake_ec2`]) that serves the catalog in two pages.

use joist_provider_aws::catalog;

use super::fake_ec2;

fn instance_type(name: &str, arch: &str) -> String {
    format!(
        "<item><instanceType>{name}</instanceType><vCpuInfo><defaultVCpus>2</defaultVCpus></vCpuInfo>\
         <memoryInfo><sizeInMiB>8192</sizeInMiB></memoryInfo><processorInfo><supportedArchitectures>\
         <item>{arch}</item></supportedArchitectures></processorInfo><networkInfo>\
         <maximumNetworkInterfaces>3</maximumNetworkInterfaces>\
         <ipv4AddressesPerInterface>10</ipv4AddressesPerInterface></networkInfo></item>"
    )
}

/// Page 1 (with a next token) unless the request asks for page 2.
fn answer(body: &str) -> (u16, String) {
    let (items, next) = if body.contains("NextToken=page-2") {
        (instance_type("m6g.large", "arm64"), String::new())
    } else {
        (
            instance_type("m5.large", "x86_64"),
            "<nextToken>page-2</nextToken>".to_owned(),
        )
    };
    let page = format!(
        "<DescribeInstanceTypesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">\
         <requestId>r</requestId><instanceTypeSet>{items}</instanceTypeSet>{next}</DescribeInstanceTypesResponse>"
    );
    (200, page)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_of_the_catalog_is_followed() {
    let (clients, seen) = fake_ec2::serve(answer).await;
    let shapes = catalog::shapes(&clients.ec2)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = shapes.keys().map(String::as_str).collect();
    assert_eq!(names, ["m5.large", "m6g.large"], "both pages");
    let requests = fake_ec2::seen(&seen);
    assert_eq!(requests.len(), 2);
    assert!(requests[0].contains("MaxResults=100"), "{}", requests[0]);
}
