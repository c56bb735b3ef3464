# tgsync for one target group: an IP target group bound by tgsync/* tags, the security
# group rule that lets the load balancer reach the pods, and (once per cluster) the tgsync
# stack itself. See README.md, "Install", and docs/install.md, "Terraform".

locals {
  binding_tags = merge(
    {
      "tgsync/cluster"   = var.cluster_name
      "tgsync/namespace" = var.namespace
      "tgsync/selector"  = var.selector
    },
    var.port == null ? {} : { "tgsync/port" = var.port },
    var.mode == "shared" ? {} : { "tgsync/mode" = var.mode },
  )

  pod_port = coalesce(
    var.pod_port_number,
    try(tonumber(var.port), null),
    var.target_port,
  )

  http = contains(["HTTP", "HTTPS"], var.protocol)
  # Groups whose traffic is UDP (their health checks are not).
  udp = contains(["UDP", "TCP_UDP"], var.protocol)
}

resource "aws_lb_target_group" "this" {
  name        = var.name
  target_type = "ip" # tgsync supports only IP target groups
  protocol    = var.protocol
  port        = var.target_port
  vpc_id      = var.vpc_id

  # tgsync deregisters a terminating pod at once; the pod keeps serving (preStop sleep)
  # a little longer than this delay.
  deregistration_delay   = var.deregistration_delay
  connection_termination = local.http ? null : var.connection_termination

  health_check {
    protocol            = var.health_check_path == null ? (local.http ? var.protocol : "TCP") : (local.http ? var.protocol : "HTTP")
    path                = var.health_check_path
    interval            = 10
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  tags = merge(var.tags, local.binding_tags)
}

# The load balancer's traffic and health checks to the pods: TCP always (the traffic of
# TCP, TLS and HTTP(S) groups, and every health check: a UDP group's are TCP, HTTP or
# HTTPS), and UDP too for UDP and TCP_UDP groups.
resource "aws_vpc_security_group_ingress_rule" "from_load_balancer" {
  count = var.pods_security_group_id != null && var.load_balancer_security_group_id != null ? 1 : 0

  security_group_id            = var.pods_security_group_id
  referenced_security_group_id = var.load_balancer_security_group_id
  ip_protocol                  = "tcp"
  from_port                    = local.pod_port
  to_port                      = local.pod_port
  description                  = "tgsync target group ${var.name}: load balancer to pods"
}

resource "aws_vpc_security_group_ingress_rule" "from_load_balancer_udp" {
  count = local.udp && var.pods_security_group_id != null && var.load_balancer_security_group_id != null ? 1 : 0

  security_group_id            = var.pods_security_group_id
  referenced_security_group_id = var.load_balancer_security_group_id
  ip_protocol                  = "udp"
  from_port                    = local.pod_port
  to_port                      = local.pod_port
  description                  = "tgsync target group ${var.name}: load balancer to pods (UDP)"
}

resource "aws_vpc_security_group_ingress_rule" "from_cidr" {
  for_each = var.pods_security_group_id != null && var.load_balancer_security_group_id == null ? toset(var.source_cidr_blocks) : toset([])

  security_group_id = var.pods_security_group_id
  cidr_ipv4         = can(cidrnetmask(each.value)) ? each.value : null
  cidr_ipv6         = can(cidrnetmask(each.value)) ? null : each.value
  ip_protocol       = "tcp"
  from_port         = local.pod_port
  to_port           = local.pod_port
  description       = "tgsync target group ${var.name}: load balancer to pods"
}

resource "aws_vpc_security_group_ingress_rule" "from_cidr_udp" {
  for_each = local.udp && var.pods_security_group_id != null && var.load_balancer_security_group_id == null ? toset(var.source_cidr_blocks) : toset([])

  security_group_id = var.pods_security_group_id
  cidr_ipv4         = can(cidrnetmask(each.value)) ? each.value : null
  cidr_ipv6         = can(cidrnetmask(each.value)) ? null : each.value
  ip_protocol       = "udp"
  from_port         = local.pod_port
  to_port           = local.pod_port
  description       = "tgsync target group ${var.name}: load balancer to pods (UDP)"
}

# The tgsync stack, from the Serverless Application Repository ...
resource "aws_serverlessapplicationrepository_cloudformation_stack" "tgsync" {
  count = try(var.stack.application_id, null) != null ? 1 : 0

  name             = var.stack.name
  application_id   = var.stack.application_id
  semantic_version = var.stack.semantic_version
  capabilities     = ["CAPABILITY_IAM", "CAPABILITY_RESOURCE_POLICY"]
  parameters       = merge(var.stack.parameters, { ClusterName = var.cluster_name })
}

# ... or from a packaged template in S3.
resource "aws_cloudformation_stack" "tgsync" {
  count = try(var.stack.template_url, null) != null ? 1 : 0

  name         = var.stack.name
  template_url = var.stack.template_url
  capabilities = ["CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"]
  parameters   = merge(var.stack.parameters, { ClusterName = var.cluster_name })
}
