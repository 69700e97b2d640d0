//! The floor under a per-call allocation: a blocking TCP ping-pong of 64
//! bytes over loopback, no gRPC and no store. Prints the round trip's
//! median and p99.
//!
//! ```sh
//! cargo run --release -p blockalloc-bench --example pingpong [ROUND_TRIPS]
//! ```
//!
//! On a VM whose idle vCPUs halt at once, each round trip wakes a halted
//! vCPU on each side; compare a run on an idle machine with one while
//! another process keeps a vCPU busy (BENCHMARKS.md, "The floor").

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

fn main() {
    let rounds = match std::env::args().nth(1).map(|a| a.parse::<usize>()) {
        None => 20_000,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("pingpong: ROUND_TRIPS must be a whole number of at least 1");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(rounds) {
        eprintln!("pingpong: {e}");
        std::process::exit(1);
    }
}

fn run(rounds: usize) -> std::io::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut buf = [0u8; 64];
        while s.read_exact(&mut buf).is_ok() {
            s.write_all(&buf)?;
        }
        Ok(())
    });
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut buf = [0u8; 64];
    let mut ns = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        s.write_all(&buf)?;
        s.read_exact(&mut buf)?;
        ns.push(t.elapsed().as_nanos() as u64);
    }
    drop(s);
    echo.join().expect("the echo thread does not panic")?;
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q) as usize] as f64 / 1e3;
    println!(
        "{rounds} round trips of 64 bytes: p50 {:.1} µs, p99 {:.1} µs",
        at(0.5),
        at(0.99)
    );
    Ok(())
}
