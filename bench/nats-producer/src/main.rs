//! `nats-producer URL STREAM SUBJECT COUNT SIZE [IN_FLIGHT]`: publishes COUNT messages of SIZE
//! bytes to SUBJECT (the stream STREAM is created on `SUBJECT`, file storage, if missing), each
//! with a distinct `Nats-Msg-Id`, at most IN_FLIGHT (1,024: async-nats stalls when far more acks wait unread) awaiting their ack, and prints
//! `{"messages":…,"seconds":…,"per_second":…}`.
//!
//! `nats-producer latency URL SUBJECT SECONDS`: subscribes to SUBJECT for SECONDS; each event's
//! row (Maxwell `data`, Debezium `after`) carries `t`, the source client's Unix time at its
//! commit; prints the percentiles of (arrival - t) in milliseconds.

use std::collections::VecDeque;
use std::time::Instant;

use async_nats::jetstream::{self, message::PublishMessage, stream};

async fn latency(url: &str, subject: &str, seconds: f64) {
    use futures_util::StreamExt;
    let client = async_nats::connect(url).await.expect("connect");
    let mut subscription = client.subscribe(subject.to_owned()).await.expect("subscribe");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs_f64(seconds);
    let mut delays = Vec::new();
    while let Ok(Some(message)) = tokio::time::timeout_at(deadline, subscription.next()).await {
        let arrived = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        let Ok(event) = serde_json::from_slice::<serde_json::Value>(&message.payload) else { continue };
        let event = event.get("payload").unwrap_or(&event);
        let row = event.get("data").or_else(|| event.get("after"));
        if let Some(sent) = row.and_then(|row| row.get("t")).and_then(serde_json::Value::as_f64) {
            delays.push((arrived - sent) * 1000.0);
        }
    }
    delays.sort_by(f64::total_cmp);
    let pick = |share: f64| {
        delays.get(((share * delays.len() as f64) as usize).min(delays.len().saturating_sub(1))).copied()
    };
    let shown = |value: Option<f64>| value.map_or("null".to_owned(), |value| format!("{value:.1}"));
    println!(
        "{{\"events\":{},\"p50_ms\":{},\"p99_ms\":{},\"max_ms\":{}}}",
        delays.len(),
        shown(pick(0.5)),
        shown(pick(0.99)),
        shown(pick(1.0))
    );
}

#[tokio::main]
async fn main() {
    let arguments: Vec<String> = std::env::args().collect();
    if arguments.get(1).map(String::as_str) == Some("latency") && arguments.len() == 5 {
        latency(&arguments[2], &arguments[3], arguments[4].parse().expect("SECONDS")).await;
        return;
    }
    if arguments.len() < 6 {
        eprintln!("usage: nats-producer URL STREAM SUBJECT COUNT SIZE [IN_FLIGHT]");
        std::process::exit(2);
    }
    let (url, stream_name, subject) = (&arguments[1], &arguments[2], arguments[3].clone());
    let count: u64 = arguments[4].parse().expect("COUNT");
    let size: usize = arguments[5].parse().expect("SIZE");
    let in_flight: usize = arguments.get(6).map_or(1024, |text| text.parse().expect("IN_FLIGHT"));
    let client = async_nats::connect(url.as_str()).await.expect("connect");
    let context = jetstream::new(client);
    context
        .get_or_create_stream(stream::Config {
            name: stream_name.clone(),
            subjects: vec![subject.clone()],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await
        .expect("the stream");
    let payload = bytes::Bytes::from(vec![b'x'; size]);
    let mut pending = VecDeque::new();
    let started = Instant::now();
    for index in 0..count {
        while pending.len() >= in_flight {
            let ack: jetstream::context::PublishAckFuture = pending.pop_front().unwrap();
            ack.await.expect("an ack");
        }
        let message = PublishMessage::build().payload(payload.clone()).message_id(format!("bench-{index}"));
        pending.push_back(context.send_publish(subject.clone(), message).await.expect("publish"));
    }
    while let Some(ack) = pending.pop_front() {
        ack.await.expect("an ack");
    }
    let seconds = started.elapsed().as_secs_f64();
    println!("{{\"messages\":{count},\"seconds\":{seconds:.3},\"per_second\":{:.0}}}", count as f64 / seconds);
}
