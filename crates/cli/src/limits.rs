//! The limit flags of `blockalloc serve`: raw values, checked and turned
//! into the service's [`Limits`]; an unset flag keeps the service's
//! default.

use std::time::Duration;

use blockalloc::ByteSize;
use blockalloc_service::Limits;
use clap::Args;

use crate::error::UsageError;

/// Limits per client and per connection (see `docs/operations.md`, "Capacity and limits").
#[derive(Debug, Args)]
#[command(next_help_heading = "Limits")]
pub struct LimitArgs {
    /// Largest request or reply message [default: 4MiB].
    #[arg(long, value_name = "SIZE")]
    pub max_message_size: Option<ByteSize>,

    /// Most calls of one client served at once; more wait in the client's
    /// own line [default: 32]. A client is named by the `blockalloc-client`
    /// request header, else by its connection.
    #[arg(long, value_name = "N")]
    pub max_in_flight_per_client: Option<usize>,

    /// Most calls of one client waiting for their turn; more are refused
    /// with UNAVAILABLE [default: 4096].
    #[arg(long, value_name = "N")]
    pub max_queued_per_client: Option<usize>,

    /// Most live leases of one client [default: 256].
    #[arg(long, value_name = "N")]
    pub max_leases_per_client: Option<usize>,

    /// Most live leases of all clients together [default: 16384].
    #[arg(long, value_name = "N")]
    pub max_leases: Option<usize>,

    /// Most concurrent calls (HTTP/2 streams) on one connection
    /// [default: 256].
    #[arg(long, value_name = "N")]
    pub max_streams_per_connection: Option<u32>,

    /// Seconds a call may take, waiting for its turn included; slower calls
    /// are cancelled [default: 60].
    ///
    /// Seconds, or a duration with a unit: `400ms`, `2m`.
    #[arg(long, value_name = "DURATION", value_parser = crate::checks::seconds)]
    pub request_timeout: Option<f64>,

    /// Seconds between HTTP/2 keep-alive pings on a connection [default: 30].
    ///
    /// Seconds, or a duration with a unit: `400ms`, `2m`.
    #[arg(long, value_name = "DURATION", value_parser = crate::checks::seconds)]
    pub keepalive_interval: Option<f64>,

    /// Seconds a keep-alive ping may go unanswered before the connection is
    /// closed [default: 10].
    ///
    /// Seconds, or a duration with a unit: `400ms`, `2m`.
    #[arg(long, value_name = "DURATION", value_parser = crate::checks::seconds)]
    pub keepalive_timeout: Option<f64>,
}

fn at_least_one<T: PartialOrd + From<u8> + std::fmt::Display>(
    flag: &str,
    v: Option<T>,
    default: T,
) -> Result<T, UsageError> {
    match v {
        Some(v) if v < T::from(1) => {
            Err(UsageError::new(format!("--{flag} {v} must be at least 1")))
        }
        Some(v) => Ok(v),
        None => Ok(default),
    }
}

fn seconds(flag: &str, v: Option<f64>, default: Duration) -> Result<Duration, UsageError> {
    match v {
        Some(s) if s.is_finite() && (0.01..=86_400.0).contains(&s) => {
            Ok(Duration::from_secs_f64(s))
        }
        Some(s) => Err(UsageError::new(format!(
            "--{flag} {s} must be between 0.01 and 86400 seconds"
        ))),
        None => Ok(default),
    }
}

impl LimitArgs {
    /// The limits these flags ask for.
    ///
    /// # Errors
    /// A [`UsageError`] for a zero count or size, or a duration out of range.
    /// `base` (the configuration file's limits, or the defaults) with the
    /// flags that are set.
    pub fn apply(&self, d: Limits) -> Result<Limits, UsageError> {
        let message = match self.max_message_size {
            Some(s) if s.bytes() < 1024 || s.bytes() > 1 << 30 => {
                return Err(UsageError::new(format!(
                    "--max-message-size {s} must be between 1KiB and 1GiB"
                )))
            }
            Some(s) => s.bytes() as usize,
            None => d.max_message_bytes,
        };
        Ok(Limits {
            max_message_bytes: message,
            max_in_flight_per_client: at_least_one(
                "max-in-flight-per-client",
                self.max_in_flight_per_client,
                d.max_in_flight_per_client,
            )?,
            max_queued_per_client: self
                .max_queued_per_client
                .unwrap_or(d.max_queued_per_client),
            max_leases_per_client: at_least_one(
                "max-leases-per-client",
                self.max_leases_per_client,
                d.max_leases_per_client,
            )?,
            max_leases: at_least_one("max-leases", self.max_leases, d.max_leases)?,
            max_streams_per_connection: at_least_one(
                "max-streams-per-connection",
                self.max_streams_per_connection,
                d.max_streams_per_connection,
            )?,
            request_timeout: seconds("request-timeout", self.request_timeout, d.request_timeout)?,
            keepalive_interval: seconds(
                "keepalive-interval",
                self.keepalive_interval,
                d.keepalive_interval,
            )?,
            keepalive_timeout: seconds(
                "keepalive-timeout",
                self.keepalive_timeout,
                d.keepalive_timeout,
            )?,
            // Set in the configuration file only.
            max_connections: d.max_connections,
            handshake_timeout: d.handshake_timeout,
        })
    }
}
