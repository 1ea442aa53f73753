//! Pagination at the SDK boundary. moto answers every describe call in one page whatever
//! `MaxResults` says, so following `NextToken` is tested here against a fake EC2 endpoint on
//! 127.0.0.1 that serves the catalog in two pages; its thread ends with the test process.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpListener,
    sync::{Arc, Mutex},
};

use aws_config::{BehaviorVersion, Region};
use aws_sdk_ec2::config::Credentials;
use joist_provider_aws::{
    catalog,
    clients::{AwsClients, http_client},
};

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
fn answer(body: &str) -> String {
    let (items, next) = if body.contains("NextToken=page-2") {
        (instance_type("m6g.large", "arm64"), String::new())
    } else {
        (
            instance_type("m5.large", "x86_64"),
            "<nextToken>page-2</nextToken>".to_owned(),
        )
    };
    format!(
        "<DescribeInstanceTypesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">\
         <requestId>r</requestId><instanceTypeSet>{items}</instanceTypeSet>{next}</DescribeInstanceTypesResponse>"
    )
}

/// Serves [`answer`] on 127.0.0.1; returns its endpoint and the request bodies it saw.
fn fake_ec2() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let endpoint = format!(
        "http://{}",
        listener.local_addr().unwrap_or_else(|e| panic!("{e}"))
    );
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            while let Some(body) = read_request(&mut reader) {
                let reply = answer(&body);
                log.lock().unwrap_or_else(|e| e.into_inner()).push(body);
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/xml\r\ncontent-length: {}\r\n\r\n",
                    reply.len()
                );
                if reader.get_mut().write_all((head + &reply).as_bytes()).is_err() {
                    break;
                }
            }
        }
    });
    (endpoint, seen)
}

/// One HTTP/1.1 request's body; `None` when the connection closed.
fn read_request(reader: &mut BufReader<std::net::TcpStream>) -> Option<String> {
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_of_the_catalog_is_followed() {
    let (endpoint, seen) = fake_ec2();
    let config = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new("us-west-2"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("testing", "testing", None, None, "static"))
        .http_client(http_client())
        .load()
        .await;
    let clients = AwsClients::from_config(&config).unwrap_or_else(|e| panic!("{e}"));
    let shapes = catalog::shapes(&clients.ec2)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = shapes.keys().map(String::as_str).collect();
    assert_eq!(names, ["m5.large", "m6g.large"], "both pages");
    let requests = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(requests.len(), 2);
    assert!(requests[0].contains("MaxResults=100"), "{}", requests[0]);
}
