//! A fake EC2 endpoint on 127.0.0.1 for what moto cannot show: how many calls were made and
//! what each asked. It answers each request with what the test's function says, and records
//! every request body; its thread ends with the test process.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpListener,
    sync::{Arc, Mutex},
};

use aws_config::{BehaviorVersion, Region};
use aws_sdk_ec2::config::Credentials;
use joist_provider_aws::clients::{AwsClients, http_client};

/// The request bodies the fake endpoint saw, in order.
pub type Seen = Arc<Mutex<Vec<String>>>;

/// Serves `answer` (a request body to an HTTP status and an XML body) on 127.0.0.1; returns
/// clients of the endpoint and the request bodies it saw.
pub async fn serve(answer: fn(&str) -> (u16, String)) -> (AwsClients, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let endpoint = format!(
        "http://{}",
        listener.local_addr().unwrap_or_else(|e| panic!("{e}"))
    );
    let seen = Seen::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                while let Some(body) = read_request(&mut reader) {
                    let (status, reply) = answer(&body);
                    log.lock().unwrap_or_else(|e| e.into_inner()).push(body);
                    let head = format!(
                        "HTTP/1.1 {status} OK\r\ncontent-type: text/xml\r\ncontent-length: {}\r\n\r\n",
                        reply.len()
                    );
                    if reader.get_mut().write_all((head + &reply).as_bytes()).is_err() {
                        break;
                    }
                }
            });
        }
    });
    let config = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new("us-west-2"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("testing", "testing", None, None, "static"))
        .http_client(http_client())
        .load()
        .await;
    let clients = AwsClients::from_config(&config).unwrap_or_else(|e| panic!("{e}"));
    (clients, seen)
}

/// The requests seen so far.
pub fn seen(seen: &Seen) -> Vec<String> {
    seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
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

/// A page of an EC2 `Describe…` answer: `action`'s response with `items` in its `set`, and the
/// token of the next page when there is one.
pub fn page(action: &str, set: &str, items: &[String], next: Option<&str>) -> (u16, String) {
    let next = next
        .map(|t| format!("<nextToken>{t}</nextToken>"))
        .unwrap_or_default();
    (
        200,
        format!(
            "<{action}Response xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">\
             <requestId>r</requestId><{set}>{}</{set}>{next}</{action}Response>",
            items.concat()
        ),
    )
}
