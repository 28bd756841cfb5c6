//! Request bodies, parsed and checked the way the service checks them, with its wording
//! (``Invalid request: `timeout` should be <= 45m.``). Pure: bytes and limits in, a typed request
//! or an [`ApiError`] out.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::wire::ApiError;

/// Memory per vCPU, fixed by the service.
pub(crate) const MB_PER_VCPU: u32 = 2048;

/// The runtimes a v2 create accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Runtime {
    Node22,
    Node24,
    Node26,
    Python313,
}

impl Runtime {
    const ALL: [Runtime; 4] = [
        Runtime::Node22,
        Runtime::Node24,
        Runtime::Node26,
        Runtime::Python313,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Runtime::Node22 => "node22",
            Runtime::Node24 => "node24",
            Runtime::Node26 => "node26",
            Runtime::Python313 => "python3.13",
        }
    }

    fn parse(s: &str) -> Option<Runtime> {
        Runtime::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// The limits a create or an extension is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Largest `timeout` a create accepts.
    pub max_timeout_ms: u64,
    /// Largest total session timeout an extension may reach (the plan's maximum).
    pub max_total_timeout_ms: u64,
    /// Largest `resources.vcpus`.
    pub max_vcpus: u32,
}

/// Which create endpoint a body came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CreateApi {
    /// `POST /v2/sandboxes`: legacy runtimes (`runtime`, default `node24`).
    V2,
    /// `POST /v3/sandboxes`: container images (`image`); `runtime` is refused. The SDK 3.x calls
    /// it whenever no `runtime` is given, which includes every create from a snapshot.
    V3,
}

/// The image a v3 create without `image` or snapshot gets.
pub(crate) const DEFAULT_IMAGE: &str = "vercel/sandbox/universal:latest";

/// The managed images the fake knows (those the SDK names; `universal` also without its
/// `:latest` tag). The service also runs custom images, which the fake, with no registry to
/// pull from, refuses with its own wording (the service's for an unknown image is not
/// documented).
pub(crate) const MANAGED_IMAGES: [&str; 6] = [
    "vercel/sandbox/universal",
    DEFAULT_IMAGE,
    "vercel/sandbox/node:22",
    "vercel/sandbox/node:24",
    "vercel/sandbox/node:26",
    "vercel/sandbox/python:3.14",
];

/// What a create sets of a sandbox that its record keeps as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SandboxSettings {
    pub vcpus: u32,
    pub timeout_ms: u64,
    pub ports: Vec<u16>,
    pub env: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
}

/// A checked create body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CreateRequest {
    pub project_id: String,
    pub name: Option<String>,
    /// `None` with a snapshot source (the snapshot decides) and on v3.
    pub runtime: Option<Runtime>,
    /// v3 only.
    pub image: Option<String>,
    pub settings: SandboxSettings,
    pub persistent: bool,
    pub source_snapshot: Option<String>,
    pub snapshot_expiration_ms: Option<u64>,
}

/// A checked run-command body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunRequest {
    pub command: String,
    pub args: Vec<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub wait: bool,
    pub logs: bool,
    pub timeout_ms: Option<u64>,
}

/// `{"path", "cwd"?, "recursive"?}` of fs/read and fs/mkdir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PathRequest {
    pub path: String,
    pub cwd: Option<String>,
    pub recursive: bool,
}

/// Default session timeout (5 minutes).
pub(crate) const DEFAULT_TIMEOUT_MS: u64 = 300_000;
/// Default vCPUs.
pub(crate) const DEFAULT_VCPUS: u32 = 2;
const MAX_TAGS: usize = 5;
const MAX_PORTS: usize = 15;
const NAME_PATTERN: &str = "^[a-zA-Z0-9_-]{1,128}$";

/// Renders a millisecond limit the way the service words it (`45m`, `5h`, `1500ms`).
pub(crate) fn human_ms(ms: u64) -> String {
    if ms > 0 && ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms > 0 && ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms > 0 && ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// Parses a JSON object body; an empty body is `{}` (the SDK sends none for a snapshot without
/// expiration).
pub(crate) fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::invalid("the body should be a JSON object.")),
        Err(e) => Err(ApiError::invalid(format!(
            "the body is not valid JSON ({e})."
        ))),
    }
}

fn type_error(field: &str, ty: &str) -> ApiError {
    ApiError::invalid(format!("`{field}` should be {ty}."))
}

fn opt_string(map: &Map<String, Value>, field: &str) -> Result<Option<String>, ApiError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(type_error(field, "string")),
    }
}

fn opt_bool(map: &Map<String, Value>, field: &str) -> Result<Option<bool>, ApiError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(type_error(field, "boolean")),
    }
}

fn opt_u64(map: &Map<String, Value>, field: &str, path: &str) -> Result<Option<u64>, ApiError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| match v.as_i64() {
            Some(_) => ApiError::invalid(format!("`{path}` should be >= 0.")),
            None => type_error(path, "integer"),
        }),
    }
}

fn string_map(map: &Map<String, Value>, field: &str) -> Result<BTreeMap<String, String>, ApiError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(o)) => o
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(type_error(&format!("{field}.{k}"), "string")),
            })
            .collect(),
        Some(_) => Err(type_error(field, "object")),
    }
}

fn string_list(map: &Map<String, Value>, field: &str) -> Result<Vec<String>, ApiError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                _ => Err(type_error(&format!("{field}[{i}]"), "string")),
            })
            .collect(),
        Some(_) => Err(type_error(field, "array")),
    }
}

/// Checks a `POST /v2/sandboxes` or `POST /v3/sandboxes` body.
pub(crate) fn create_request(
    body: &[u8],
    limits: &Limits,
    api: CreateApi,
) -> Result<CreateRequest, ApiError> {
    let map = object(body)?;
    let project_id = opt_string(&map, "projectId")?
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ApiError::invalid("should have required property `projectId`."))?;

    let name = opt_string(&map, "name")?;
    if let Some(n) = &name {
        let ok = !n.is_empty()
            && n.len() <= 128
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !ok {
            return Err(ApiError::invalid(format!(
                "`name` should match pattern \"{NAME_PATTERN}\" (got {n:?})."
            )));
        }
    }

    let source_snapshot = match map.get("source") {
        None | Some(Value::Null) => None,
        Some(Value::Object(src)) => match src.get("type").and_then(Value::as_str) {
            Some("snapshot") => Some(
                opt_string(src, "snapshotId")?
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| {
                        ApiError::invalid("`source` should have required property `snapshotId`.")
                    })?,
            ),
            Some(t @ ("git" | "tarball")) => {
                return Err(ApiError::invalid(format!(
                    "`source.type` \"{t}\" is not supported by taskbox fake-vercel, which has no \
                     network access; create from a snapshot or without a source."
                )))
            }
            _ => {
                return Err(ApiError::invalid(
                    "`source.type` should be equal to one of the allowed values: git, tarball, snapshot.",
                ))
            }
        },
        Some(_) => return Err(type_error("source", "object")),
    };

    let image = opt_string(&map, "image")?;
    match api {
        CreateApi::V2 if image.is_some() => return Err(ApiError::invalid(
            "`image` is only accepted by POST /v3/sandboxes; POST /v2/sandboxes takes a `runtime`.",
        )),
        // The service's wording, as reported (vercel-sandbox-late-2026.md).
        CreateApi::V3 if map.get("runtime").is_some_and(|r| !r.is_null()) => {
            return Err(ApiError::invalid(
                "should NOT have additional property `runtime`.",
            ))
        }
        _ => {}
    }
    if let Some(image) = &image {
        if !MANAGED_IMAGES.contains(&image.as_str()) {
            return Err(ApiError::invalid(format!(
                "`image` {image:?} is not an image taskbox fake-vercel knows; it runs only \
                 Vercel's managed images: {}.",
                MANAGED_IMAGES.join(", ")
            )));
        }
    }
    let image = match (api, &source_snapshot) {
        (CreateApi::V3, None) => Some(image.unwrap_or_else(|| DEFAULT_IMAGE.to_string())),
        _ => image,
    };

    let runtime = match opt_string(&map, "runtime")? {
        None => None,
        Some(r) => Some(Runtime::parse(&r).ok_or_else(|| {
            ApiError::invalid(format!(
                "`runtime` should be equal to one of the allowed values: {} (got {r:?}).",
                Runtime::ALL.map(Runtime::as_str).join(", ")
            ))
        })?),
    };
    if runtime.is_some() && source_snapshot.is_some() {
        return Err(ApiError::invalid(
            "`runtime` cannot be combined with a `source` of type \"snapshot\": the snapshot \
             already fixes the runtime. Omit `runtime`.",
        ));
    }
    let runtime = match (runtime, &source_snapshot, api) {
        (Some(r), _, _) => Some(r),
        (None, None, CreateApi::V2) => Some(Runtime::Node24),
        (None, _, _) => None,
    };

    let vcpus = match map.get("resources") {
        None | Some(Value::Null) => DEFAULT_VCPUS,
        Some(Value::Object(res)) => {
            let vcpus = match opt_u64(res, "vcpus", "resources.vcpus")? {
                None => DEFAULT_VCPUS,
                Some(v) => u32::try_from(v).unwrap_or(u32::MAX),
            };
            if vcpus == 0 || (vcpus != 1 && vcpus % 2 != 0) || vcpus > limits.max_vcpus {
                return Err(ApiError::invalid(format!(
                    "`resources.vcpus` must be 1 or an even number up to {} (got {vcpus}).",
                    limits.max_vcpus
                )));
            }
            if let Some(memory) = opt_u64(res, "memory", "resources.memory")? {
                let expected = u64::from(vcpus) * u64::from(MB_PER_VCPU);
                if memory != expected {
                    return Err(ApiError::invalid(format!(
                        "`resources.memory` must equal {MB_PER_VCPU} × `resources.vcpus` \
                         (expected {expected} for {vcpus} vCPUs, got {memory})."
                    )));
                }
            }
            vcpus
        }
        Some(_) => return Err(type_error("resources", "object")),
    };

    let timeout_ms = opt_u64(&map, "timeout", "timeout")?.unwrap_or(DEFAULT_TIMEOUT_MS);
    if timeout_ms < 1000 {
        return Err(ApiError::invalid("`timeout` should be >= 1000."));
    }
    if timeout_ms > limits.max_timeout_ms {
        return Err(ApiError::invalid(format!(
            "`timeout` should be <= {}.",
            human_ms(limits.max_timeout_ms)
        )));
    }

    let ports = match map.get("ports") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            if items.len() > MAX_PORTS {
                return Err(ApiError::invalid(format!(
                    "`ports` should NOT have more than {MAX_PORTS} items."
                )));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_u64()
                        .and_then(|p| u16::try_from(p).ok())
                        .filter(|p| *p > 0)
                        .ok_or_else(|| {
                            ApiError::invalid(format!(
                                "`ports[{i}]` should be an integer between 1 and 65535."
                            ))
                        })
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        Some(_) => return Err(type_error("ports", "array")),
    };

    let env = string_map(&map, "env")?;
    let tags = string_map(&map, "tags")?;
    if tags.len() > MAX_TAGS {
        return Err(ApiError::invalid(format!(
            "`tags` should NOT have more than {MAX_TAGS} properties."
        )));
    }
    // Sandboxes are persistent unless told otherwise (the service's default for named sandboxes).
    let persistent = opt_bool(&map, "persistent")?.unwrap_or(true);
    let snapshot_expiration_ms = opt_u64(&map, "snapshotExpiration", "snapshotExpiration")?;

    Ok(CreateRequest {
        project_id,
        name,
        runtime,
        image,
        settings: SandboxSettings {
            vcpus,
            timeout_ms,
            ports,
            env,
            tags,
        },
        persistent,
        source_snapshot,
        snapshot_expiration_ms,
    })
}

/// Checks a run-command body.
pub(crate) fn run_request(body: &[u8]) -> Result<RunRequest, ApiError> {
    let map = object(body)?;
    let command = opt_string(&map, "command")?
        .filter(|c| !c.is_empty())
        .ok_or_else(|| ApiError::invalid("should have required property `command`."))?;
    let timeout_ms = opt_u64(&map, "timeout", "timeout")?;
    if let Some(t) = timeout_ms {
        if t < 100 {
            return Err(ApiError::invalid("`timeout` should be >= 100."));
        }
    }
    Ok(RunRequest {
        command,
        args: string_list(&map, "args")?,
        cwd: opt_string(&map, "cwd")?,
        env: string_map(&map, "env")?,
        wait: opt_bool(&map, "wait")?.unwrap_or(false),
        logs: opt_bool(&map, "logs")?.unwrap_or(false),
        timeout_ms,
    })
    .and_then(|r| {
        // `sudo` is accepted (and ignored: the fake runs as its own user) but must be a boolean.
        opt_bool(&map, "sudo")?;
        Ok(r)
    })
}

/// Checks a fs/read or fs/mkdir body.
pub(crate) fn path_request(body: &[u8]) -> Result<PathRequest, ApiError> {
    let map = object(body)?;
    let path = opt_string(&map, "path")?
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ApiError::invalid("should have required property `path`."))?;
    Ok(PathRequest {
        path,
        cwd: opt_string(&map, "cwd")?,
        recursive: opt_bool(&map, "recursive")?.unwrap_or(false),
    })
}

/// Checks an extend-timeout body: `{"duration": ms >= 1000}`.
pub(crate) fn extend_request(body: &[u8]) -> Result<u64, ApiError> {
    let map = object(body)?;
    let duration = opt_u64(&map, "duration", "duration")?
        .ok_or_else(|| ApiError::invalid("should have required property `duration`."))?;
    if duration < 1000 {
        return Err(ApiError::invalid("`duration` should be >= 1000."));
    }
    Ok(duration)
}

/// Checks a kill body: `{"signal": number}`.
pub(crate) fn kill_request(body: &[u8]) -> Result<i32, ApiError> {
    let map = object(body)?;
    let signal = opt_u64(&map, "signal", "signal")?
        .ok_or_else(|| ApiError::invalid("should have required property `signal`."))?;
    if !(1..=64).contains(&signal) {
        return Err(ApiError::invalid(format!(
            "`signal` should be a signal number between 1 and 64 (got {signal})."
        )));
    }
    Ok(signal as i32)
}

/// Checks a snapshot body: `{"expiration"?: ms}`, 0 meaning never.
pub(crate) fn snapshot_request(body: &[u8]) -> Result<Option<u64>, ApiError> {
    let map = object(body)?;
    opt_u64(&map, "expiration", "expiration")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_timeout_ms: 2_700_000,
            max_total_timeout_ms: 2_700_000,
            max_vcpus: 8,
        }
    }

    fn create(json: &str) -> Result<CreateRequest, ApiError> {
        create_request(json.as_bytes(), &limits(), CreateApi::V2)
    }

    #[test]
    fn v3_takes_images_and_refuses_runtimes() {
        let v3 = |json: &str| create_request(json.as_bytes(), &limits(), CreateApi::V3);
        let r = v3(r#"{"projectId":"p"}"#).unwrap();
        assert_eq!((r.runtime, r.image.as_deref()), (None, Some(DEFAULT_IMAGE)));
        let r =
            v3(r#"{"projectId":"p","source":{"type":"snapshot","snapshotId":"snap_1"}}"#).unwrap();
        assert_eq!((r.runtime, r.image), (None, None));
        assert_eq!(
            v3(r#"{"projectId":"p","runtime":"node24"}"#)
                .unwrap_err()
                .message,
            "Invalid request: should NOT have additional property `runtime`."
        );
        for image in MANAGED_IMAGES {
            let r = v3(&format!(r#"{{"projectId":"p","image":"{image}"}}"#)).unwrap();
            assert_eq!(r.image.as_deref(), Some(image));
        }
        let unknown = v3(r#"{"projectId":"p","image":"ghcr.io/me/mine:1"}"#).unwrap_err();
        assert_eq!(unknown.status, 400);
        assert!(
            unknown
                .message
                .contains("\"ghcr.io/me/mine:1\" is not an image")
                && unknown.message.contains("vercel/sandbox/universal"),
            "{}",
            unknown.message
        );
        assert!(create(r#"{"projectId":"p","image":"x"}"#)
            .unwrap_err()
            .message
            .contains("/v3/"));
    }

    #[test]
    fn minimal_create_gets_the_defaults() {
        let r = create(r#"{"projectId":"prj_1"}"#).unwrap();
        assert_eq!(r.runtime, Some(Runtime::Node24));
        assert_eq!(r.settings.vcpus, 2);
        assert_eq!(r.settings.timeout_ms, 300_000);
        assert!(r.persistent);
        assert!(r.name.is_none());
    }

    #[test]
    fn memory_must_be_2048_per_vcpu() {
        let e = create(r#"{"projectId":"p","resources":{"vcpus":2,"memory":3000}}"#).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.code, "bad_request");
        assert_eq!(
            e.message,
            "Invalid request: `resources.memory` must equal 2048 × `resources.vcpus` \
             (expected 4096 for 2 vCPUs, got 3000)."
        );
        assert!(create(r#"{"projectId":"p","resources":{"vcpus":4,"memory":8192}}"#).is_ok());
    }

    #[test]
    fn vcpus_are_one_or_even_up_to_the_max() {
        for bad in ["3", "0", "10"] {
            let body = format!(r#"{{"projectId":"p","resources":{{"vcpus":{bad}}}}}"#);
            let e = create(&body).unwrap_err();
            assert!(e.message.contains("`resources.vcpus`"), "{}", e.message);
        }
        for good in ["1", "2", "8"] {
            let body = format!(r#"{{"projectId":"p","resources":{{"vcpus":{good}}}}}"#);
            assert!(create(&body).is_ok(), "{good}");
        }
    }

    #[test]
    fn runtime_is_checked_and_never_combined_with_a_snapshot() {
        let e = create(r#"{"projectId":"p","runtime":"ruby3"}"#).unwrap_err();
        assert!(e
            .message
            .contains("`runtime` should be equal to one of the allowed values"));
        let e = create(
            r#"{"projectId":"p","runtime":"node24","source":{"type":"snapshot","snapshotId":"snap_1"}}"#,
        )
        .unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("Omit `runtime`"), "{}", e.message);
        let r = create(r#"{"projectId":"p","source":{"type":"snapshot","snapshotId":"snap_1"}}"#)
            .unwrap();
        assert_eq!(r.runtime, None);
        assert_eq!(r.source_snapshot.as_deref(), Some("snap_1"));
        assert!(create(r#"{"projectId":"p","runtime":"python3.13"}"#).is_ok());
    }

    #[test]
    fn timeout_bounds_use_the_service_wording() {
        let e = create(r#"{"projectId":"p","timeout":2700001}"#).unwrap_err();
        assert_eq!(e.message, "Invalid request: `timeout` should be <= 45m.");
        let e = create(r#"{"projectId":"p","timeout":999}"#).unwrap_err();
        assert_eq!(e.message, "Invalid request: `timeout` should be >= 1000.");
        let e = create(r#"{"projectId":"p","timeout":"5m"}"#).unwrap_err();
        assert_eq!(e.message, "Invalid request: `timeout` should be integer.");
    }

    #[test]
    fn tags_names_ports_and_project() {
        let e =
            create(r#"{"projectId":"p","tags":{"a":"1","b":"2","c":"3","d":"4","e":"5","f":"6"}}"#)
                .unwrap_err();
        assert_eq!(
            e.message,
            "Invalid request: `tags` should NOT have more than 5 properties."
        );
        assert!(create(r#"{"projectId":"p","name":"has space"}"#).is_err());
        assert!(create(r#"{"projectId":"p","name":"taskbox-t1-g0"}"#).is_ok());
        assert!(create(r#"{"name":"x"}"#)
            .unwrap_err()
            .message
            .contains("projectId"));
        assert!(create(r#"{"projectId":"p","ports":[0]}"#).is_err());
        assert!(create(r#"[1]"#).is_err());
        assert!(
            create(r#"{"projectId":"p","source":{"type":"git","url":"x"}}"#)
                .unwrap_err()
                .message
                .contains("no network")
        );
    }

    #[test]
    fn other_bodies() {
        let r = run_request(br#"{"command":"bash","args":["-c","echo hi"],"wait":true}"#).unwrap();
        assert!(r.wait && !r.logs);
        assert!(run_request(br#"{"args":[]}"#).is_err());
        assert!(run_request(br#"{"command":"x","args":[1]}"#).is_err());
        assert!(run_request(br#"{"command":"x","timeout":5}"#).is_err());
        assert_eq!(kill_request(br#"{"signal":15}"#).unwrap(), 15);
        assert!(kill_request(br#"{"signal":"TERM"}"#).is_err());
        assert_eq!(extend_request(br#"{"duration":60000}"#).unwrap(), 60_000);
        assert!(extend_request(br#"{"duration":10}"#).is_err());
        assert_eq!(snapshot_request(b"").unwrap(), None);
        assert_eq!(snapshot_request(br#"{"expiration":0}"#).unwrap(), Some(0));
        assert!(path_request(br#"{"cwd":"/"}"#).is_err());
    }

    #[test]
    fn human_ms_words() {
        assert_eq!(human_ms(2_700_000), "45m");
        assert_eq!(human_ms(18_000_000), "5h");
        assert_eq!(human_ms(90_000), "90s");
        assert_eq!(human_ms(1500), "1500ms");
    }
}
