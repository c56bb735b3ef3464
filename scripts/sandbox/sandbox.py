"""The sandbox's AWS setup and its steps; run by scripts/sandbox.sh with the venv's Python.

    sandbox.py setup    create the VPC, internal NLB, bound IP target group (with one
                        foreign target) and the DynamoDB state table in moto
    sandbox.py steps    drive the functions (cargo lambda invoke for the schedule and pod
                        events, the tgsync CLI for the operator's runs) and check every
                        outcome; exit 1 on the first step that is not what it should be

Everything it needs comes from environment variables set by scripts/sandbox.sh
(SANDBOX_*). Only botocore/boto3 (installed with moto) and the standard library are used.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
import threading
import os
import re
import secrets
import ssl
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import boto3
import botocore.session

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
EVENTS = ROOT / "events"

REGION = "us-east-1"
CLUSTER = "demo"
NAMESPACE = "shop"
SELECTOR = "app=web"
GROUP_NAME = "shop-web-8080"
LB_NAME = "shop-web"
PORT = 8080
FOREIGN = "10.0.9.9:8080"  # registered by hand: "an operator's instance"

# The pods of scripts/sandbox/pods.json the steps act on.
SEED = json.loads((HERE / "pods.json").read_text())["items"]
READY_WEB = sorted(
    f"{p['status']['podIP']}:{PORT}"
    for p in SEED
    if p["metadata"]["labels"].get("app") == "web"
    and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])
)
NOT_READY_POD = "web-7d9f8c6b5-q8z2n"  # 10.0.1.15, readiness probe not passed yet
KILLED_POD = "web-7d9f8c6b5-7hq9m"  # 10.0.1.12
OTHER_APP = "10.0.1.31:8080"  # cart pod: same namespace, other selector
KILLED_TARGET = next(
    f"{p['status']['podIP']}:{PORT}" for p in SEED if p["metadata"]["name"] == KILLED_POD
)


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        sys.exit(f"sandbox.py: {name} is not set (run scripts/sandbox.sh)")
    return value


VERBOSE = os.environ.get("SANDBOX_VERBOSE") == "1"
COLOR = sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def style(code: str, text: str) -> str:
    return f"\033[{code}m{text}\033[0m" if COLOR else text


def bold(t: str) -> str:
    return style("1", t)


def dim(t: str) -> str:
    return style("2", t)


def green(t: str) -> str:
    return style("32", t)


def red(t: str) -> str:
    return style("31;1", t)


def out(line: str = "") -> None:
    print(line, flush=True)


# ---------------------------------------------------------------------------------------
# AWS (moto)


def aws(service: str):
    return boto3.client(
        service,
        region_name=REGION,
        endpoint_url=env("SANDBOX_MOTO"),
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        aws_session_token="testing",
    )


def setup() -> None:
    ec2, elb, ddb = aws("ec2"), aws("elbv2"), aws("dynamodb")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=az)["Subnet"][
            "SubnetId"
        ]
        for i, az in ((0, "us-east-1a"), (1, "us-east-1b"))
    ]
    lb = elb.create_load_balancer(
        Name=LB_NAME, Type="network", Scheme="internal", Subnets=subnets
    )["LoadBalancers"][0]
    tg = elb.create_target_group(
        Name=GROUP_NAME,
        Protocol="TCP",
        Port=PORT,
        VpcId=vpc,
        TargetType="ip",
        HealthCheckProtocol="HTTP",
        HealthCheckPath="/healthz",
        Tags=[
            {"Key": "tgsync/cluster", "Value": CLUSTER},
            {"Key": "tgsync/namespace", "Value": NAMESPACE},
            {"Key": "tgsync/selector", "Value": SELECTOR},
        ],
    )["TargetGroups"][0]
    arn = tg["TargetGroupArn"]
    elb.create_listener(
        LoadBalancerArn=lb["LoadBalancerArn"],
        Protocol="TCP",
        Port=80,
        DefaultActions=[{"Type": "forward", "TargetGroupArn": arn}],
    )
    ip, port = FOREIGN.split(":")
    elb.register_targets(TargetGroupArn=arn, Targets=[{"Id": ip, "Port": int(port)}])

    # The state table exactly as template.yaml declares it.
    table = env("SANDBOX_TABLE")
    ddb.create_table(
        TableName=table,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
    )
    ddb.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 1})
    ddb.update_time_to_live(
        TableName=table,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": "expiresAt"},
    )

    out(f"  VPC            {vpc} (10.0.0.0/16; subnets {', '.join(subnets)})")
    out(f"  NLB            {LB_NAME}: internal, TCP :80 -> {GROUP_NAME}")
    out(f"  target group   {arn}")
    out(
        f"                 ip, TCP {PORT}; tags tgsync/cluster={CLUSTER} "
        f"tgsync/namespace={NAMESPACE} tgsync/selector={SELECTOR}"
    )
    out(f"                 {FOREIGN} registered by hand (an operator's instance)")
    out(f"  state table    {table}: pk S HASH, sk S RANGE, PAY_PER_REQUEST, TTL on expiresAt")


def group_arn() -> str:
    groups = aws("elbv2").describe_target_groups(Names=[GROUP_NAME])["TargetGroups"]
    return groups[0]["TargetGroupArn"]


def targets(arn: str) -> dict[str, str]:
    """Registered targets (`ip:port` -> health state), as DescribeTargetHealth shows them."""
    descs = aws("elbv2").describe_target_health(TargetGroupArn=arn)["TargetHealthDescriptions"]
    return {
        f"{d['Target']['Id']}:{d['Target']['Port']}": d["TargetHealth"]["State"] for d in descs
    }


def ledger(arn: str) -> dict[str, dict]:
    """tgsync's ledger for the group (`ip:port` -> entry), read straight from the group's
    item in DynamoDB (one item per target group). A row with `gone` is the tombstone of
    a target tgsync deregistered, kept for the forget grace so that a registration that
    lands late is undone: not a target tgsync holds, so left out."""
    item = aws("dynamodb").get_item(
        TableName=env("SANDBOX_TABLE"),
        Key={"pk": {"S": f"tg#{arn}"}, "sk": {"S": "group"}},
        ConsistentRead=True,
    ).get("Item", {})
    entries = item.get("ledger", {}).get("M", {})
    return {
        target: {k: next(iter(v.values())) for k, v in entry["M"].items()}
        for target, entry in entries.items()
        if "gone" not in entry["M"]
    }


def ip_sort_key(target: str):
    ip, port = target.rsplit(":", 1)
    return (tuple(int(x) for x in ip.split(".")), int(port))


def show(label: str, arn: str) -> tuple[dict[str, str], dict[str, dict]]:
    tg, rows = targets(arn), ledger(arn)
    out(f"  {bold(label)}  {dim(GROUP_NAME)}")
    lines = [("TARGET", "HEALTH", "OWNER")]
    for t in sorted(set(tg) | set(rows), key=ip_sort_key):
        if t in rows:
            row = rows[t]
            owner = f"tgsync ({row.get('ns', '?')}/{row.get('pod', '?')})"
        else:
            owner = "foreign (not in ledger)"
        lines.append((t, tg.get(t, "- (not registered)"), owner))
    if len(lines) == 1:
        lines.append(("(no targets)", "", ""))
    w0 = max(len(r[0]) for r in lines)
    w1 = max(len(r[1]) for r in lines)
    for i, (a, b, c) in enumerate(lines):
        text = f"    {a:<{w0}}  {b:<{w1}}  {c}".rstrip()
        out(dim(text) if i == 0 else text)
    return tg, rows


# ---------------------------------------------------------------------------------------
# Kubernetes API (the emulator), with an EKS token minted as `aws eks get-token` does


def eks_token() -> str:
    session = botocore.session.get_session()
    sts = session.create_client(
        "sts",
        region_name=REGION,
        endpoint_url=env("SANDBOX_MOTO"),
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        aws_session_token="testing",
    )

    def add_cluster_header(request, **_):
        request.headers["x-k8s-aws-id"] = CLUSTER

    sts.meta.events.register("before-sign.sts.GetCallerIdentity", add_cluster_header)
    url = sts.generate_presigned_url(
        "get_caller_identity", Params={}, ExpiresIn=60, HttpMethod="GET"
    )
    return "k8s-aws-v1." + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def kube(method: str, path: str, body: dict | None = None, content_type: str | None = None):
    url = env("SANDBOX_KUBE_URL").rstrip("/") + path
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {eks_token()}", "Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = content_type or "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    ctx = ssl.create_default_context(cafile=env("SANDBOX_CA_FILE"))
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")
        raise StepFailed(f"{method} {path} -> HTTP {e.code}: {detail}", "emulator") from None


def pod_path(name: str, sub: str = "") -> str:
    return f"/api/v1/namespaces/{NAMESPACE}/pods/{urllib.parse.quote(name)}{sub}"


def mark_ready(name: str) -> dict:
    """Turns pod `name` ready, as the kubelet does (a strategic-merge patch of its
    status); returns the pod as the API server then has it."""
    patch = {
        "status": {
            "conditions": [
                {"type": "ContainersReady", "status": "True"},
                {"type": "Ready", "status": "True"},
            ],
            "containerStatuses": [{"name": "app", "ready": True}],
        }
    }
    return kube("PATCH", pod_path(name, "/status"), patch, "application/strategic-merge-patch+json")


def list_pods() -> list[dict]:
    q = urllib.parse.urlencode({"labelSelector": SELECTOR})
    return kube("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?{q}")["items"]


# ---------------------------------------------------------------------------------------
# The functions, through cargo lambda invoke


class StepFailed(Exception):
    def __init__(self, message: str, log: str | None = None):
        super().__init__(message)
        self.log = log


def invoke(function: str, data_file: Path) -> dict:
    port = env("SANDBOX_RESYNC_PORT" if function == "resync" else "SANDBOX_POD_EVENTS_PORT")
    rel = data_file.relative_to(ROOT) if data_file.is_relative_to(ROOT) else data_file.name
    out(f"  {bold('invoke')}  tgsync-{function}  <-  {rel}")
    proc = subprocess.run(
        [
            env("SANDBOX_CARGO_LAMBDA"),
            "lambda",
            "invoke",
            "--invoke-address",
            "127.0.0.1",
            "--invoke-port",
            port,
            "--data-file",
            str(data_file),
            "--output-format",
            "json",
            "_",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise StepFailed(
            f"cargo lambda invoke failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}",
            function,
        )
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise StepFailed(f"the report is not JSON:\n{proc.stdout}{proc.stderr}", function) from None
    if VERBOSE:
        out(dim("  report (full):"))
        for line in json.dumps(report, indent=2).splitlines():
            out(dim("    " + line))
    return report


def cli_env() -> dict[str, str]:
    """The environment an operator's shell would give `tgsync` here: the sandbox's AWS
    (moto), the manual function's Lambda Invoke API (cargo lambda watch, whose function
    is `_`), the deployment's cluster and table, and the emulator's endpoint and CA for
    `status`'s pod reads."""
    return {
        "PATH": os.environ.get("PATH", ""),
        "AWS_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ENDPOINT_URL": env("SANDBOX_MOTO"),
        "AWS_ENDPOINT_URL_LAMBDA": f"http://127.0.0.1:{env('SANDBOX_MANUAL_PORT')}",
        "TGSYNC_MANUAL_FUNCTION": "_",
        "TGSYNC_CLUSTER_NAME": CLUSTER,
        "TGSYNC_TABLE_NAME": env("SANDBOX_TABLE"),
        "TGSYNC_CLUSTER_ENDPOINT": env("SANDBOX_KUBE_URL"),
        "TGSYNC_CLUSTER_CA_FILE": env("SANDBOX_CA_FILE"),
        "NO_COLOR": "1",
    }


def tgsync(*args: str, expect: int = 0, show: bool = True) -> subprocess.CompletedProcess:
    """Runs the CLI as an operator would (no terminal); its output is printed unless it
    is JSON, and its exit code must be `expect`."""
    out(f"  {bold('tgsync')}  tgsync {' '.join(args)}")
    proc = subprocess.run(
        [env("SANDBOX_TGSYNC"), *args],
        env=cli_env(),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != expect:
        raise StepFailed(
            f"tgsync {' '.join(args)} exited {proc.returncode}, not {expect}:\n{proc.stdout}{proc.stderr}",
            "manual",
        )
    if show and "--json" not in args:
        for line in proc.stdout.rstrip("\n").splitlines():
            out(f"          {line}".rstrip())
    if VERBOSE and "--json" in args:
        for line in proc.stdout.splitlines():
            out(dim("    " + line))
    return proc


def tgsync_json(*args: str, expect: int = 0) -> dict:
    proc = tgsync(*args, "--json", expect=expect)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise StepFailed(f"tgsync's --json output is not JSON:\n{proc.stdout}{proc.stderr}", "manual") from None


def short(targets_: list[str], limit: int = 4) -> str:
    if not targets_:
        return ""
    shown = ", ".join(targets_[:limit])
    more = f", +{len(targets_) - limit}" if len(targets_) > limit else ""
    return f" ({shown}{more})"


def summarize(report: dict, arn: str) -> dict | None:
    """Prints one line for the run and one per group; returns our group's report."""
    totals = report.get("totals", {})
    head = (
        f"{report.get('function')}{' (dry run)' if report.get('dryRun') else ''}: "
        f"{totals.get('groups', 0)} group(s), {totals.get('errors', 0)} error(s), "
        f"{report.get('durationMs', '?')} ms"
    )
    out(f"  {bold('report')}  {head}")
    for note in report.get("notes", []):
        out(f"          note: {note}")
    for err in report.get("errors", []):
        out(f"          {red('error')}: {err}")
    ours = None
    for g in report.get("groups", []):
        if g.get("targetGroupArn") == arn:
            ours = g
        if g.get("outcome") == "planned" and g.get("plan") is not None:
            p = g["plan"]
            parts = [
                f"register {len(p.get('register', []))}{short(p.get('register', []))}",
                f"deregister {len(p.get('deregister', []))}{short(p.get('deregister', []))}",
                f"adopt {len(p.get('adopt', []))}",
                f"forget {len(p.get('forget', []))}",
                f"foreignKept {len(p.get('foreignKept', []))}{short(p.get('foreignKept', []))}",
            ]
        else:
            parts = [
                f"registered {len(g.get('registered', []))}{short(g.get('registered', []))}",
                f"deregistered {len(g.get('deregistered', []))}{short(g.get('deregistered', []))}",
                f"foreignKept {len(g.get('foreignKept', []))}{short(g.get('foreignKept', []))}",
            ]
            if g.get("forgotten"):
                parts.append(f"forgotten {len(g['forgotten'])}{short(g['forgotten'])}")
        errors = len(g.get("failedTargets", [])) + len(g.get("podErrors", [])) + bool(g.get("error"))
        parts.append(f"errors {errors}")
        out(f"          {g.get('name')}: {bold(str(g.get('outcome')))} - " + ", ".join(parts))
        if g.get("error"):
            out(f"            {red('error')}: {g['error']}")
        for f in g.get("failedTargets", []):
            out(f"            {red('failed')}: {f}")
        for e in g.get("podErrors", []):
            out(f"            {red('pod error')}: {e}")
    return ours


# ---------------------------------------------------------------------------------------
# Checks


class Checks:
    def __init__(self, log: str):
        self.failures: list[str] = []
        self.passed: list[str] = []
        self.log = log

    def that(self, ok: bool, what: str, got=None) -> None:
        if ok:
            self.passed.append(what)
        else:
            self.failures.append(what + (f" (got {got!r})" if got is not None else ""))

    def done(self) -> None:
        if self.failures:
            for f in self.failures:
                out(f"  {red('FAIL')}  {f}")
            raise StepFailed(f"{len(self.failures)} check(s) failed", self.log)
        out(f"  {green('ok')}      " + "; ".join(self.passed))


def group_checks(c: Checks, g: dict | None, outcome: str) -> dict:
    c.that(g is not None, "the report has the target group")
    g = g or {}
    c.that(g.get("outcome") == outcome, f"outcome {outcome}", g.get("outcome"))
    c.that(
        not g.get("error") and not g.get("failedTargets") and not g.get("podErrors"),
        "no errors",
        {k: g.get(k) for k in ("error", "failedTargets", "podErrors") if g.get(k)},
    )
    return g


def exporter_event(reason: str, message: str, pod: dict) -> Path:
    """A kubernetes-event-exporter EventBridge event about `pod`, shaped like
    events/pod-killing.json (the exporter's sink), for cluster `demo`."""
    event = json.loads((EVENTS / "pod-killing.json").read_text())
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    meta = pod["metadata"]
    event["id"] = str(uuid.uuid4())
    event["time"] = stamp
    d = event["detail"]
    d["clusterName"] = CLUSTER
    d["metadata"].update(
        name=f"{meta['name']}.{secrets.token_hex(8)}",
        namespace=NAMESPACE,
        uid=str(uuid.uuid4()),
        creationTimestamp=stamp,
    )
    io = d["involvedObject"]
    io.update(
        kind="Pod",
        namespace=NAMESPACE,
        name=meta["name"],
        uid=meta["uid"],
        resourceVersion=meta.get("resourceVersion", ""),
        labels=meta.get("labels", {}),
        deleted=False,
    )
    node = pod["spec"].get("nodeName", "")
    d["source"] = {"component": "kubelet", "host": node}
    d["reportingInstance"] = node
    d.update(
        reason=reason,
        message=message,
        type="Normal",
        firstTimestamp=stamp,
        lastTimestamp=stamp,
        count=1,
    )
    path = Path(env("SANDBOX_WORK")) / f"event-{reason.lower()}-{meta['name']}.json"
    path.write_text(json.dumps(event, indent=2))
    return path


# ---------------------------------------------------------------------------------------
# Steps

STEPS = 8


def heading(n: int, title: str) -> None:
    out()
    out(bold(f"== step {n}/{STEPS}: {title}"))


def step_dry_run(arn: str) -> None:
    heading(1, "dry run: `tgsync plan` (the manual function) plans, changes nothing")
    before = show("before", arn)
    tgsync("plan", GROUP_NAME, expect=2)
    report = tgsync_json("plan", GROUP_NAME, expect=2)
    g = summarize(report, arn)
    after = show("after", arn)
    c = Checks("manual")
    c.that(report.get("function") == "manual", "the manual function answered", report.get("function"))
    c.that(report.get("dryRun") is True, "dryRun", report.get("dryRun"))
    g = group_checks(c, g, "planned")
    plan = g.get("plan") or {}
    c.that(plan.get("register") == READY_WEB, "plan registers the 4 ready web pods", plan.get("register"))
    c.that(not plan.get("deregister"), "plan deregisters nothing", plan.get("deregister"))
    c.that(plan.get("foreignKept") == [FOREIGN], f"plan keeps {FOREIGN}", plan.get("foreignKept"))
    c.that(after == before, "target group and ledger unchanged", after)
    c.done()


def step_scheduled(arn: str) -> None:
    heading(2, "scheduled resync: the ready pods are registered")
    show("before", arn)
    report = invoke("resync", EVENTS / "scheduled.json")
    g = group_checks(c := Checks("resync"), summarize(report, arn), "changed")
    tg, rows = show("after", arn)
    c.that(sorted(g.get("registered", []), key=ip_sort_key) == READY_WEB,
           "registered the 4 ready web pods", g.get("registered"))
    c.that(g.get("foreignKept") == [FOREIGN], f"foreign {FOREIGN} kept", g.get("foreignKept"))
    c.that(set(tg) == set(READY_WEB) | {FOREIGN}, "group = ready pods + foreign", sorted(tg))
    c.that(set(rows) == set(READY_WEB), "ledger = ready pods only", sorted(rows))
    c.that("10.0.1.15:8080" not in tg, "not-ready pod 10.0.1.15 not registered")
    c.that(OTHER_APP not in tg, "app=cart pod not registered")
    tgsync("status", "--targets")
    status = tgsync_json("status")
    sg = next((x for x in status.get("groups", []) if x.get("targetGroupArn") == arn), {})
    c.that(
        (sg.get("desired"), sg.get("registered"), sg.get("healthy"), sg.get("owned"), sg.get("foreign"))
        == (4, 5, 5, 4, 1),
        "status: desired 4, registered 5, healthy 5, owned 4, foreign 1",
        sg,
    )
    c.that(sg.get("lastVerifiedAt") is not None, "status: verified by the resync", sg.get("lastVerifiedAt"))
    c.done()


def step_killing(arn: str) -> None:
    heading(3, f"pod termination: {KILLED_POD} deleted, Killing event to tgsync-pod-events")
    show("before", arn)
    pod = kube("GET", pod_path(KILLED_POD))
    target = f"{pod['status']['podIP']}:{PORT}"
    kube("DELETE", pod_path(KILLED_POD), {"kind": "DeleteOptions", "apiVersion": "v1"})
    out(f"  {bold('kube')}    DELETE {pod_path(KILLED_POD)} ({target}) -> 200; "
        f"{len(list_pods())} app=web pods left")
    event = exporter_event("Killing", "Stopping container app", pod)
    report = invoke("pod-events", event)
    g = group_checks(c := Checks("pod-events"), summarize(report, arn), "changed")
    tg, rows = show("after", arn)
    c.that(g.get("deregistered") == [target], f"deregistered {target}", g.get("deregistered"))
    c.that(not g.get("registered"), "registered nothing", g.get("registered"))
    c.that(target not in tg, f"{target} gone from the group")
    c.that(target not in rows, f"ledger row {target} gone")
    c.that(FOREIGN in tg and FOREIGN not in rows, f"foreign {FOREIGN} kept")
    c.that(set(tg) == (set(READY_WEB) - {target}) | {FOREIGN}, "other targets untouched", sorted(tg))
    c.done()


def step_started(arn: str) -> None:
    heading(4, f"pod starts: Started event for {NOT_READY_POD}, which turns Ready while pod-events waits")
    show("before", arn)
    pod = kube("GET", pod_path(NOT_READY_POD))
    target = f"{pod['status']['podIP']}:{PORT}"
    ready_before = {c["type"]: c["status"] for c in pod["status"]["conditions"]}.get("Ready")
    # As in a cluster: the container starts (Started event) before its readiness probe
    # passes. pod-events waits up to TGSYNC_READY_WAIT_SECONDS for Ready; the kubelet
    # patches the status while it waits.
    event = exporter_event("Started", "Started container app", pod)
    result: dict = {}
    sender = threading.Thread(target=lambda: result.update(report=invoke("pod-events", event)))
    sender.start()
    time.sleep(0.8)
    pod = mark_ready(NOT_READY_POD)
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    out(f"  {bold('kube')}    PATCH {pod_path(NOT_READY_POD, '/status')} (strategic merge), "
        f"0.8 s after the event: Ready {ready_before} -> {ready.get('Ready')} ({target})")
    sender.join()
    if "report" not in result:
        raise StepFailed("the Started invocation failed (see above)", "pod-events")
    report = result["report"]
    g = group_checks(c := Checks("pod-events"), summarize(report, arn), "changed")
    tg, rows = show("after", arn)
    c.that(ready_before == "False" and ready.get("Ready") == "True", "the pod turned Ready", ready)
    c.that(g.get("registered") == [target], f"registered {target}", g.get("registered"))
    c.that(not g.get("deregistered"), "deregistered nothing", g.get("deregistered"))
    c.that(target in tg and target in rows, f"{target} in the group and the ledger")
    c.that(FOREIGN in tg, f"foreign {FOREIGN} kept")
    c.done()


def step_converged(arn: str) -> None:
    heading(5, "next scheduled resync: already in sync, nothing comes back")
    before = show("before", arn)
    report = invoke("resync", EVENTS / "scheduled.json")
    g = group_checks(c := Checks("resync"), summarize(report, arn), "inSync")
    after = show("after", arn)
    c.that(not g.get("registered") and not g.get("deregistered"), "no calls",
           {k: g.get(k) for k in ("registered", "deregistered")})
    c.that(after == before, "target group and ledger unchanged")
    c.that(KILLED_TARGET not in after[0], f"deleted pod's {KILLED_TARGET} not registered again")
    plan = tgsync("plan", expect=0)
    c.that("nothing to do" in plan.stdout, "`tgsync plan` finds nothing to do (exit 0)")
    c.done()


def create_pod(name: str, ip: str, gated: bool = False) -> None:
    """Creates an app=web pod like the not-ready seed pod, then reports it Running at
    `ip`, not ready yet, as the API server and the kubelet do (the pod is created without
    a status). With `gated`, it declares the readiness gate and its containers are ready:
    the pod is not Ready until the gate is True."""
    template = next(p for p in SEED if p["metadata"]["name"] == NOT_READY_POD)
    pod = json.loads(json.dumps(template))
    pod["metadata"] = {
        "name": name,
        "namespace": NAMESPACE,
        "labels": template["metadata"]["labels"],
    }
    status = pod.pop("status")
    status["podIP"] = ip
    status["podIPs"] = [{"ip": ip}]
    if gated:
        pod["spec"]["readinessGates"] = [{"conditionType": GATE}]
        status["conditions"] = [
            c for c in status["conditions"] if c["type"] not in ("ContainersReady", "Ready")
        ] + [{"type": "ContainersReady", "status": "True"}, {"type": "Ready", "status": "False"}]
    kube("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
    kube("PATCH", pod_path(name, "/status"), {"status": status}, "application/merge-patch+json")


WATCH_POD = "web-7d9f8c6b5-w4tch"  # created not ready in step 6, 10.0.1.16
WATCH_TARGET = f"10.0.1.16:{PORT}"


def step_watch(arn: str) -> None:
    heading(6, f"watch mode: {WATCH_POD} turns Ready while the scheduled resync watches (no event sent)")
    show("before", arn)
    # As in a cluster: the API server creates the pod without a status; the kubelet then
    # reports it Running with its IP, not ready yet.
    create_pod(WATCH_POD, "10.0.1.16")
    out(f"  {bold('kube')}    POST {WATCH_POD}, then PATCH its status: Running at 10.0.1.16, not ready yet")
    # The scheduled resync: its full diff, then it watches (TGSYNC_WATCH_SECONDS).
    result: dict = {}
    runner = threading.Thread(
        target=lambda: result.update(report=invoke("resync", EVENTS / "scheduled.json"))
    )
    runner.start()
    time.sleep(2.0)
    mark_ready(WATCH_POD)
    patched = time.monotonic()
    delay = None
    while time.monotonic() - patched < 10:
        if WATCH_TARGET in targets(arn):
            delay = time.monotonic() - patched
            break
        time.sleep(0.02)
    shown = "not within 10 s" if delay is None else f"{delay * 1000:.0f} ms later"
    out(f"  {bold('kube')}    PATCH {pod_path(WATCH_POD, '/status')}: Ready True; "
        f"{WATCH_TARGET} in the target group {shown}")
    runner.join()
    if "report" not in result:
        raise StepFailed("the watching resync invocation failed (see above)", "resync")
    report = result["report"]
    watch = report.get("watch") or {}
    out(f"  {bold('watch')}   {watch.get('watchedMs', 0) / 1000:.1f} s, "
        f"{watch.get('events', 0)} pod event(s), {watch.get('passes', 0)} pass(es), "
        f"registered {watch.get('registered', 0)}, deregistered {watch.get('deregistered', 0)}")
    c = Checks("resync")
    tg, rows = show("after", arn)
    c.that(delay is not None and delay < 2.0, "registered within 2 s of turning Ready", shown)
    c.that(watch.get("registered") == 1, "the watch registered it", watch)
    c.that(WATCH_TARGET in rows, f"{WATCH_TARGET} in the ledger")
    c.that(FOREIGN in tg, f"foreign {FOREIGN} kept")
    c.done()


ROLLOUT_POD = "web-7d9f8c6b5-r0ll1"  # the new pod of step 7, 10.0.1.17, gated
ROLLOUT_TARGET = f"10.0.1.17:{PORT}"
GATE = "tgsync/target-health"


def gate_status(name: str) -> str | None:
    pod = kube("GET", pod_path(name))
    return {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}.get(GATE)


def step_rollout(arn: str) -> None:
    heading(7, f"a rolling update: {ROLLOUT_POD} (readiness gate {GATE}) replaces {WATCH_POD}")
    show("before", arn)
    # The Deployment's new pod (surge 1): its containers ready, the pod not Ready until
    # its gate is True (the kubelet's rule).
    create_pod(ROLLOUT_POD, "10.0.1.17", gated=True)
    out(f"  {bold('kube')}    POST {ROLLOUT_POD} with readiness gate {GATE}: containers ready at "
        f"10.0.1.17, the pod not Ready until the gate is True")
    result: dict = {}
    runner = threading.Thread(
        target=lambda: result.update(report=invoke("resync", EVENTS / "scheduled.json"))
    )
    runner.start()
    started = time.monotonic()
    opened = None
    while time.monotonic() - started < 10:
        if gate_status(ROLLOUT_POD) == "True":
            opened = time.monotonic() - started
            break
        time.sleep(0.05)
    shown = "not within 10 s" if opened is None else f"{opened:.1f} s into the run"
    out(f"  {bold('kube')}    {GATE} True on {ROLLOUT_POD} {shown} (set by tgsync once the "
        f"target was healthy; here moto reports it healthy at once, an NLB after its health checks)")
    # The kubelet turns the pod Ready; the Deployment then deletes an old pod.
    mark_ready(ROLLOUT_POD)
    old = kube("GET", pod_path(WATCH_POD))
    old_target = f"{old['status']['podIP']}:{PORT}"
    kube("DELETE", pod_path(WATCH_POD), {"kind": "DeleteOptions", "apiVersion": "v1"})
    deleted = time.monotonic()
    gone = None
    while time.monotonic() - deleted < 10:
        if old_target not in targets(arn):
            gone = time.monotonic() - deleted
            break
        time.sleep(0.02)
    left = "not within 10 s" if gone is None else f"{gone * 1000:.0f} ms later"
    out(f"  {bold('kube')}    DELETE {pod_path(WATCH_POD)}: {old_target} out of the target group {left}")
    runner.join()
    if "report" not in result:
        raise StepFailed("the watching resync invocation failed (see above)", "resync")
    c = Checks("resync")
    tg, rows = show("after", arn)
    c.that(opened is not None, "tgsync opened the new pod's gate", gate_status(ROLLOUT_POD))
    c.that(ROLLOUT_TARGET in tg and ROLLOUT_TARGET in rows, f"{ROLLOUT_TARGET} in the group and the ledger")
    c.that(gone is not None and gone < 2.0, f"the old pod's {old_target} left within 2 s of its deletion", left)
    c.that(old_target not in rows, f"ledger row {old_target} gone")
    c.that(FOREIGN in tg, f"foreign {FOREIGN} kept")
    c.done()


def step_release(arn: str) -> None:
    heading(8, "the way out: tags removed, the group is reported orphaned, then released")
    show("before", arn)
    aws("elbv2").remove_tags(
        ResourceArns=[arn], TagKeys=["tgsync/cluster", "tgsync/namespace", "tgsync/selector"]
    )
    out(f"  {bold('elbv2')}   RemoveTags tgsync/cluster, tgsync/namespace, tgsync/selector")
    c = Checks("manual")
    report = tgsync_json("sync")
    orphans = report.get("orphans") or []
    owned = set(ledger(arn))
    out(f"  {bold('report')}  orphans: " + ", ".join(
        f"{o['targetGroupArn'].split('/')[-2]} ({o['targets']} targets)" for o in orphans))
    c.that([o["targetGroupArn"] for o in orphans] == [arn], "the untagged group is an orphan", orphans)
    c.that(orphans and orphans[0]["targets"] == len(owned), f"holding the {len(owned)} owned targets")
    c.that(set(targets(arn)) == owned | {FOREIGN}, "and nothing was touched", sorted(targets(arn)))
    # No terminal to ask on and no --yes: the plan is shown, nothing changes (exit 3).
    refused = tgsync("release", GROUP_NAME, expect=3)
    c.that("pass --yes" in refused.stderr, "release without --yes is refused", refused.stderr)
    plan = (summarize(tgsync_json("release", GROUP_NAME, expect=3)["plan"], arn) or {}).get("plan") or {}
    c.that(set(plan.get("deregister", [])) == owned, "the plan deregisters the owned targets",
           plan.get("deregister"))
    c.that(plan.get("foreignKept") == [FOREIGN], f"and keeps {FOREIGN}", plan.get("foreignKept"))
    c.that(set(targets(arn)) == owned | {FOREIGN}, "the refused release changed nothing")
    report = tgsync_json("release", "--yes", GROUP_NAME)["release"]
    g = group_checks(c, summarize(report, arn), "released")
    tg, rows = show("after", arn)
    c.that(set(g.get("deregistered", [])) == owned, "deregistered what tgsync owned", g.get("deregistered"))
    c.that(set(tg) == {FOREIGN}, f"only the foreign {FOREIGN} is left", sorted(tg))
    c.that(not rows, "the group's ledger is gone", sorted(rows))
    c.done()


def tail(path: str, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(cannot read {path}: {e})"
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(text[-lines:]))


def steps() -> None:
    arn = group_arn()
    try:
        step_dry_run(arn)
        step_scheduled(arn)
        step_killing(arn)
        step_started(arn)
        step_converged(arn)
        step_watch(arn)
        step_rollout(arn)
        step_release(arn)
    except StepFailed as e:
        out(f"  {red('FAILED')}  {e}")
        logs = {
            "resync": env("SANDBOX_RESYNC_LOG"),
            "pod-events": env("SANDBOX_POD_EVENTS_LOG"),
            "manual": env("SANDBOX_MANUAL_LOG"),
            "emulator": env("SANDBOX_EMULATOR_LOG"),
        }
        for name in dict.fromkeys([e.log, "emulator"]):
            if name in logs:
                out(f"\n--- last lines of {logs[name]} ---")
                out(tail(logs[name], 40 if name == e.log else 10))
        sys.exit(1)


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in ("setup", "steps"):
        sys.exit(__doc__)
    try:
        {"setup": setup, "steps": steps}[sys.argv[1]]()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
