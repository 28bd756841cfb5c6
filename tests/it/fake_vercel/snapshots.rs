//! Snapshots: deleted and expired snapshots answer 410, listed or restored.

use reqwest::StatusCode;
use serde_json::json;

use super::{bounded, expect_error, json_of, start_with};

#[tokio::test]
async fn deleted_and_expired_snapshots_answer_410() {
    bounded(async {
        let fake = start_with(|o| o.snapshot_settle_ms = 0).await;
        let restore = |snap: String, name: &'static str| {
            fake.post(
                "/v2/sandboxes",
                json!({"projectId": "prj_1", "name": name,
                       "source": {"type": "snapshot", "snapshotId": snap}}),
            )
        };

        let s1 = fake.session_id("snap-a").await;
        let snap = fake.snapshot(&s1, json!({"expiration": 0})).await;
        assert!(snap["snapshot"].get("expiresAt").is_none(), "never expires");
        let id = snap["snapshot"]["id"].as_str().unwrap().to_string();
        let deleted = json_of(fake.delete(&format!("/v2/sandboxes/snapshots/{id}")).await).await;
        assert_eq!(deleted["snapshot"]["status"], "deleted");
        let resp = fake.get(&format!("/v2/sandboxes/snapshots/{id}")).await;
        expect_error(resp, 410, "snapshot_not_found").await;
        expect_error(
            restore(id.clone(), "from-deleted").await,
            410,
            "snapshot_not_found",
        )
        .await;

        let s2 = fake.session_id("snap-b").await;
        let snap = fake.snapshot(&s2, json!({"expiration": 86_400_000})).await;
        assert!(snap["snapshot"]["expiresAt"].is_u64());
        let id = snap["snapshot"]["id"].as_str().unwrap().to_string();
        let listed = json_of(fake.get("/v2/sandboxes/snapshots?name=snap-b").await).await;
        assert_eq!(listed["snapshots"][0]["id"], id.as_str());
        let resp = fake
            .http
            .post(fake.admin(&format!("/expire-snapshot/{id}")))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let resp = fake.get(&format!("/v2/sandboxes/snapshots/{id}")).await;
        expect_error(resp, 410, "snapshot_not_found").await;
        expect_error(restore(id, "from-expired").await, 410, "snapshot_not_found").await;
        let listed = json_of(fake.get("/v2/sandboxes/snapshots?name=snap-b").await).await;
        assert_eq!(listed["snapshots"], json!([]));
        let resp = fake.get("/v2/sandboxes/snapshots/snap_never").await;
        expect_error(resp, 404, "not_found").await;
    })
    .await;
}
