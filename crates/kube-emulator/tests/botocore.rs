//! Cross-check against the reference token minter: the AWS CLI's
//! `aws eks get-token` (awscli/customizations/eks/get_token.py), driven
//! through botocore exactly as the CLI does.

mod common;

use std::process::Command;

use common::Client;
use kube_emulator::{Emulator, EmulatorConfig};

const ACCESS_KEY_ID: &str = "AKIDBOTOCORETEST1234";
const SECRET_ACCESS_KEY: &str = "botocore/Test+Secret/Key0123456789abcdefg";

/// The CLI's TokenGenerator and STSClientFactory, reduced to the calls
/// that shape the token.
const GET_TOKEN_PY: &str = r#"
import base64, sys
import botocore.session

K8S_AWS_ID_HEADER = 'x-k8s-aws-id'
cluster = sys.argv[1]

session = botocore.session.get_session()
sts = session.create_client('sts', region_name='us-east-1')

def _retrieve_k8s_aws_id(params, context, **kwargs):
    if K8S_AWS_ID_HEADER in params:
        context[K8S_AWS_ID_HEADER] = params.pop(K8S_AWS_ID_HEADER)

def _inject_k8s_aws_id_header(request, **kwargs):
    if K8S_AWS_ID_HEADER in request.context:
        request.headers[K8S_AWS_ID_HEADER] = request.context[K8S_AWS_ID_HEADER]

sts.meta.events.register('provide-client-params.sts.GetCallerIdentity', _retrieve_k8s_aws_id)
sts.meta.events.register('before-sign.sts.GetCallerIdentity', _inject_k8s_aws_id_header)

url = sts.generate_presigned_url(
    'get_caller_identity',
    Params={K8S_AWS_ID_HEADER: cluster},
    ExpiresIn=60,
    HttpMethod='GET',
)
print('k8s-aws-v1.' + base64.urlsafe_b64encode(url.encode('utf-8')).decode('utf-8').rstrip('='))
"#;

fn botocore_available() -> bool {
    Command::new("python3")
        .args(["-c", "import botocore"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn mint_with_botocore(cluster: &str, session_token: Option<&str>) -> String {
    let mut command = Command::new("python3");
    command
        .args(["-c", GET_TOKEN_PY, cluster])
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null");
    for var in [
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_STS",
        "AWS_STS_REGIONAL_ENDPOINTS",
        "AWS_USE_FIPS_ENDPOINT",
        "AWS_USE_DUALSTACK_ENDPOINT",
    ] {
        command.env_remove(var);
    }
    if let Some(token) = session_token {
        command.env("AWS_SESSION_TOKEN", token);
    }
    let output = command.output().expect("python3 runs");
    assert!(
        output.status.success(),
        "botocore token minting failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("UTF-8 token")
        .trim()
        .to_owned()
}

async fn emulator(cluster: &str) -> Emulator {
    let mut config = EmulatorConfig::new(cluster);
    config.credentials = vec![(ACCESS_KEY_ID.to_owned(), SECRET_ACCESS_KEY.to_owned())];
    Emulator::start(config).await.expect("emulator starts")
}

#[tokio::test]
async fn accepts_tokens_minted_like_aws_eks_get_token() {
    if !botocore_available() {
        if std::env::var("TGSYNC_SKIP_BOTOCORE").as_deref() == Ok("1") {
            eprintln!("skipping: botocore is not installed and TGSYNC_SKIP_BOTOCORE=1");
            return;
        }
        panic!(
            "python3 with botocore is needed for this cross-check: install it (pip install botocore, or apt-get install python3-botocore), or set TGSYNC_SKIP_BOTOCORE=1 to skip"
        );
    }
    let prod = emulator("prod").await;
    let staging = emulator("staging").await;

    for session_token in [None, Some("IQoJb3JpZ2luX2VjEXAMPLE+/session=token")] {
        let token = mint_with_botocore("prod", session_token);
        assert!(token.starts_with("k8s-aws-v1."), "{token}");

        let mut client = Client::new(&prod);
        client.token = Some(token.clone());
        let answer = client.get("/api/v1/pods").await;
        assert_eq!(
            answer.status,
            200,
            "prod must accept a CLI token: {}",
            answer.json()
        );

        let mut other = Client::new(&staging);
        other.token = Some(token);
        assert_eq!(
            other.get("/api/v1/pods").await.status,
            401,
            "the token names another cluster"
        );
    }
    assert!(prod.faults().requests().iter().all(|r| r.authenticated));
    assert!(staging.faults().requests().iter().all(|r| !r.authenticated));
}
