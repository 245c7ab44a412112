//! Frames of the socket protocol: a 4-byte big-endian unsigned length, then one msgpack map;
//! serving/protocol/framing.py.

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::{Error, Result};

/// Larger frames mean a broken peer; the Python runtime's own limit is 64 MiB.
pub const MAX_FRAME_BYTES: u32 = 256 * 1024 * 1024;

/// One frame's body; `None` on a clean end of stream between frames. The body grows as it
/// arrives, so a header that announces more than the peer sends allocates nothing up front.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_bytes: u32,
) -> Result<Option<Vec<u8>>> {
    let mut header = [0u8; 4];
    let mut got = 0;
    while got < header.len() {
        match reader.read(&mut header[got..]).await? {
            0 if got == 0 => return Ok(None),
            0 => {
                return Err(Error::Protocol(format!(
                    "stream ended inside a frame header ({got} bytes)"
                )))
            }
            n => got += n,
        }
    }
    let length = u32::from_be_bytes(header);
    if length > max_bytes {
        return Err(Error::Protocol(format!("frame of {length} bytes")));
    }
    let mut body = Vec::with_capacity((length as usize).min(1 << 20));
    reader
        .take(u64::from(length))
        .read_to_end(&mut body)
        .await?;
    if body.len() != length as usize {
        return Err(Error::Protocol(format!(
            "stream ended after {} of {length} frame bytes",
            body.len()
        )));
    }
    Ok(Some(body))
}

/// A frame: the body's length (4 bytes, big-endian), then the body.
pub fn frame(body: &[u8]) -> Result<Vec<u8>> {
    let length = u32::try_from(body.len())
        .ok()
        .filter(|len| *len <= MAX_FRAME_BYTES)
        .ok_or_else(|| Error::Protocol(format!("message of {} bytes", body.len())))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&length.to_be_bytes());
    frame.extend_from_slice(body);
    Ok(frame)
}
