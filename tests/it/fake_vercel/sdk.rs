//! Vercel's own SDK run against the fake (`tests/sdk/conformance.mjs`).

use std::path::Path;

use taskbox::fake::Endpoint;

use super::{bounded, start_with, TOKEN};

#[tokio::test]
async fn the_official_sdk_conforms() {
    let sdk_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk");
    assert!(
        sdk_dir
            .join("node_modules/@vercel/sandbox/package.json")
            .is_file(),
        "Vercel's SDK is not installed for the conformance test: run `npm ci --prefix tests/sdk` \
         (needs Node.js >= 20.18 and the npm registry)"
    );
    bounded(async {
        let fake = start_with(|o| o.token = Some(TOKEN.to_string())).await;
        let mut node = tokio::process::Command::new("node");
        node.arg(sdk_dir.join("conformance.mjs"))
            .env("TASKBOX_FAKE_VERCEL_URL", fake.server.base_url())
            .env("TASKBOX_FAKE_VERCEL_TOKEN", TOKEN)
            .kill_on_drop(true);
        let out = node.output().await.unwrap_or_else(|e| {
            panic!("cannot run `node` for the SDK conformance test ({e}); install Node.js >= 20.18")
        });
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "the SDK disagrees with the fake:\n{stdout}{stderr}"
        );
        assert!(stdout.contains("conformance: ok"), "{stdout}{stderr}");
        eprint!("{stdout}");
        let stats = fake.server.stats();
        assert!(stats.requests_to(Endpoint::CreateSnapshot) >= 1);
        fake.server.shutdown().await.unwrap();
    })
    .await;
}
