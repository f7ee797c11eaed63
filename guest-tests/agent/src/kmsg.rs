//! /dev/kmsg records, as the agent reads them in the guest.

use crate::proto::KmsgRecord;

/// One /dev/kmsg record: `prefix,seq,ts_us,flags[,...];message\n` followed
/// by optional dictionary lines starting with a space.
pub fn parse_kmsg_record(text: &str) -> Option<KmsgRecord> {
    let (head, rest) = text.split_once(';')?;
    let mut f = head.split(',');
    let prefix: u32 = f.next()?.parse().ok()?;
    let seq: u64 = f.next()?.parse().ok()?;
    let ts_us: u64 = f.next()?.parse().ok()?;
    let msg = rest.lines().next().unwrap_or("");
    Some(KmsgRecord {
        seq,
        level: (prefix & 7) as u8,
        ts_us,
        msg: unescape_kmsg(msg),
    })
}

/// /dev/kmsg escapes non-printable bytes as `\xNN`.
fn unescape_kmsg(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && b.get(i + 1) == Some(&b'x') {
            if let Some(Ok(v)) = s.get(i + 2..i + 4).map(|h| u8::from_str_radix(h, 16)) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kmsg_record() {
        let r = parse_kmsg_record(
            "4,1234,5678901,-;virtio_net virtio0 eth0: x\\x0a y\n SUBSYSTEM=net\n",
        )
        .unwrap();
        assert_eq!((r.level, r.seq, r.ts_us), (4, 1234, 5_678_901));
        assert_eq!(r.msg, "virtio_net virtio0 eth0: x\n y");
        assert!(parse_kmsg_record("garbage").is_none());
        // facility 3 (daemon) level 6
        assert_eq!(parse_kmsg_record("30,1,2,-;hi").unwrap().level, 6);
    }
}
