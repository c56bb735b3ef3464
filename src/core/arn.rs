//! What an ARN says without asking AWS: its account (groups of several accounts are
//! told apart, and calls routed, by it) and a target group's name.

/// The account id in an ARN (`arn:<partition>:<service>:<region>:<account>:<resource>`):
/// target groups of several accounts are told apart, and calls routed, by it. `None`
/// when the ARN has no 12-digit account field.
pub fn arn_account(arn: &str) -> Option<&str> {
    let mut parts = arn.splitn(6, ':');
    if parts.next() != Some("arn") {
        return None;
    }
    let account = parts.nth(3)?;
    parts.next()?;
    (account.len() == 12 && account.bytes().all(|b| b.is_ascii_digit())).then_some(account)
}

/// The name in a target group ARN (`…:targetgroup/<name>/<id>`), or the ARN itself
/// when it has none: a group's name for a report where only its ARN is at hand.
pub fn arn_name(arn: &str) -> &str {
    arn.rsplit('/').nth(1).unwrap_or(arn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn account_of_an_arn() {
        assert_eq!(
            arn_account(
                "arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/web/0123456789abcdef"
            ),
            Some("123456789012")
        );
        assert_eq!(
            arn_account("arn:aws-cn:elasticloadbalancing:cn-north-1:210987654321:targetgroup/a/b"),
            Some("210987654321")
        );
        assert_eq!(
            arn_account("arn:aws:iam::123456789012:role/tgsync"),
            Some("123456789012")
        );
        for bad in [
            "arn:tg",
            "",
            "arn:aws:elasticloadbalancing:us-east-1:12345:targetgroup/a/b",
            "xrn:aws:e:r:123456789012:x",
        ] {
            assert_eq!(arn_account(bad), None, "{bad}");
        }
    }
}
