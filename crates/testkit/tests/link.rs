//! The link emulator against a real toxiproxy server and a real TCP echo server.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rowsync_testkit::link::{Direction, Link};

/// An echo server on a free loopback port: every connection gets its bytes back; what
/// each connection received, in full, is sent to the receiver when it ends.
fn echo_server() -> (SocketAddr, mpsc::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let sender = sender.clone();
            std::thread::spawn(move || {
                let mut received = Vec::new();
                let mut buffer = [0u8; 8192];
                loop {
                    match stream.read(&mut buffer) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            received.extend_from_slice(&buffer[..n]);
                            if stream.write_all(&buffer[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = stream.shutdown(Shutdown::Both);
                let _ = sender.send(received);
            });
        }
    });
    (addr, receiver)
}

/// Sends `payload` through `link`; what came back before the echo was complete or the
/// link closed the connection. (toxiproxy closes both sides on a half-close, so the
/// sending side stays open.)
fn round_trip(link: &Link, payload: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(link.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let reader = stream.try_clone().unwrap();
    let data = payload.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stream.write_all(&data);
        stream
    });
    let mut back = Vec::new();
    let _ = reader.take(payload.len() as u64).read_to_end(&mut back);
    drop(writer.join().unwrap());
    back
}

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

#[test]
fn a_link_without_toxics_passes_everything() {
    let link = Link::start(echo_server().0).unwrap();
    let data = payload(200_000);
    assert!(round_trip(&link, &data) == data);
}

#[test]
fn a_cut_ends_the_connection_at_that_offset_in_each_direction() {
    let (upstream, received) = echo_server();
    let link = Link::start(upstream).unwrap();
    let data = payload(100_000);
    // Cut on the way up: the server got exactly the first 12,345 bytes.
    link.cut_after(Direction::Upstream, 12_345).unwrap();
    round_trip(&link, &data);
    let got = received.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(got.len(), 12_345);
    assert!(got == data[..12_345]);
    link.clear().unwrap();
    // Cut on the way down: the client got exactly the first 777 bytes back.
    link.cut_after(Direction::Downstream, 777).unwrap();
    let back = round_trip(&link, &data);
    assert_eq!(back.len(), 777);
    assert!(back == data[..777]);
    link.clear().unwrap();
    while received.try_recv().is_ok() {}
    // Removed, the link carries everything again.
    assert!(round_trip(&link, &data) == data);
}

#[test]
fn bandwidth_and_latency_slow_the_link_down() {
    let link = Link::start(echo_server().0).unwrap();
    // 64 kbit/s is 8,000 bytes a second: 16,000 bytes take at least 2 s one way.
    link.set_bandwidth(Direction::Upstream, 64).unwrap();
    link.set_latency(Direction::Downstream, 300).unwrap();
    let data = payload(16_000);
    let started = Instant::now();
    assert!(round_trip(&link, &data) == data);
    assert!(
        started.elapsed() >= Duration::from_millis(2_300),
        "{:?}",
        started.elapsed()
    );
    assert!(link.set_bandwidth(Direction::Upstream, 12).is_err());
    link.clear().unwrap();
}
