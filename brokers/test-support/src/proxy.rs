//! A TCP proxy that a test cuts and restores, as an outage of the server behind it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio_util::sync::CancellationToken;

/// A TCP proxy to a server (a database, a broker) that can be cut: while cut, its port
/// refuses connections and every connection it carried has been reset.
pub struct Proxy {
    address: SocketAddr,
    upstream: SocketAddr,
    /// Cancelled by a cut: the listener and every connection of this period stop.
    period: Mutex<CancellationToken>,
}

impl Proxy {
    /// A proxy to `upstream` on a port of loopback's own choosing, which the proxy keeps
    /// across cuts.
    pub async fn start(upstream: SocketAddr) -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let proxy = Arc::new(Self {
            address: listener.local_addr().expect("the proxy's address"),
            upstream,
            period: Mutex::new(CancellationToken::new()),
        });
        proxy.serve(listener);
        proxy
    }

    fn serve(self: &Arc<Self>, listener: TcpListener) {
        let period = self.period.lock().unwrap().clone();
        let upstream = self.upstream;
        tokio::spawn(async move {
            loop {
                let client = tokio::select! {
                    () = period.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok((client, _)) => client,
                        Err(_) => continue,
                    },
                };
                let period = period.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return reset(client);
                    };
                    forward(client, server, period).await;
                });
            }
        });
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Refuses new connections (the listener is closed) and resets the open ones.
    pub fn cut(&self) {
        self.period.lock().unwrap().cancel();
    }

    /// Listens on the same port again.
    pub fn restore(self: &Arc<Self>) {
        let socket = TcpSocket::new_v4().expect("a socket");
        socket.set_reuseaddr(true).expect("SO_REUSEADDR");
        socket
            .bind(self.address)
            .expect("bind the proxy's port again");
        let listener = socket.listen(64).expect("listen");
        *self.period.lock().unwrap() = CancellationToken::new();
        self.serve(listener);
    }

    /// `url` with its server's address replaced by the proxy's. mysql_async moves a
    /// connection to the server's Unix socket, past the proxy, unless told not to.
    pub fn url(&self, url: &str) -> String {
        let url = url.replacen(&self.upstream.to_string(), &self.address.to_string(), 1);
        if !url.starts_with("mysql:") {
            return url;
        }
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}prefer_socket=false")
    }
}

/// Copies both ways until either side closes or the period ends; then resets both.
async fn forward(mut client: TcpStream, mut server: TcpStream, period: CancellationToken) {
    tokio::select! {
        () = period.cancelled() => {}
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
    }
    reset(client);
    reset(server);
}

/// Closes with a TCP reset, as a crashed server or a severed network does.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
}
