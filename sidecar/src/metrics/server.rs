//! A minimal HTTP/1.1 endpoint for Prometheus: `GET /metrics` (text format 0.0.4) and
//! `GET /healthz`. One request per connection; anything else is 404/405. Small on purpose:
//! a scrape endpoint needs no framework.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::error::Result;

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Request heads above this are refused; scrapers send a few hundred bytes.
const MAX_HEAD_BYTES: usize = 8 * 1024;

/// Renders the exposition at scrape time.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Binds `addr` now (so a taken port fails the start-up) and returns the bound address and
/// the serving future.
pub async fn bind(
    addr: SocketAddr,
    render: Render,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, impl std::future::Future<Output = ()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((local, serve(listener, render, shutdown)))
}

async fn serve(listener: TcpListener, render: Render, shutdown: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.cancelled() => return,
        };
        match accepted {
            Ok((stream, _)) => {
                let render = render.clone();
                tokio::spawn(async move {
                    let answer =
                        tokio::time::timeout(Duration::from_secs(10), answer(stream, render));
                    if let Ok(Err(e)) = answer.await {
                        tracing::debug!(error = %e, "metrics request failed");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(mut stream: TcpStream, render: Render) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 || head.len() + n > MAX_HEAD_BYTES {
            return Ok(());
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let (status, content_type, body) = route(&head, &render);
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// Status line, content type and body for a request head.
pub fn route(head: &[u8], render: &Render) -> (&'static str, &'static str, String) {
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => ("200 OK", CONTENT_TYPE, render()),
        ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".into()),
        (_, "/metrics" | "/healthz") => ("405 Method Not Allowed", "text/plain", String::new()),
        _ => ("404 Not Found", "text/plain", "not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serves_metrics_and_refuses_other_paths() {
        let render: Render = Arc::new(|| "taskfleet_x_total 1\n".to_string());
        let stop = CancellationToken::new();
        let (addr, serving) = bind("127.0.0.1:0".parse().unwrap(), render, stop.clone())
            .await
            .unwrap();
        tokio::spawn(serving);
        for (request, expect) in [
            ("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "200 OK"),
            ("GET /nothing HTTP/1.1\r\n\r\n", "404 Not Found"),
            ("POST /metrics HTTP/1.1\r\n\r\n", "405 Method Not Allowed"),
        ] {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).await.unwrap();
            assert!(
                response.starts_with(&format!("HTTP/1.1 {expect}")),
                "{response}"
            );
            if expect == "200 OK" {
                assert!(response.contains(CONTENT_TYPE));
                assert!(response.ends_with("taskfleet_x_total 1\n"));
            }
        }
        stop.cancel();
    }
}
