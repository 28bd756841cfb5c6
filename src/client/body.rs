//! [`ChannelBody`]: an HTTP body whose data frames arrive on a channel, for the bodies that
//! stream both ways through the API — the run endpoint's NDJSON answer (server side) and a
//! command's stdin (client side).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Bytes, Frame};
use tokio::sync::mpsc;

/// A body made of what arrives on its channel; it ends when every sender is dropped.
#[derive(Debug)]
pub struct ChannelBody(mpsc::Receiver<Bytes>);

impl ChannelBody {
    /// A body and the sender that feeds it (`capacity` chunks buffered).
    pub fn new(capacity: usize) -> (mpsc::Sender<Bytes>, ChannelBody) {
        let (tx, rx) = mpsc::channel(capacity);
        (tx, ChannelBody(rx))
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}
