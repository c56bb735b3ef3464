# tgsync example (Terraform): an internal NLB, a TCP listener and an IP target group that
# opts in to tgsync with tags; the same as infra/example-nlb.yaml. tgsync (template.yaml,
# same ClusterName) keeps the group's targets equal to the ready pods matching
# namespace + selector. The pods' security groups must allow the NLB's traffic and
# health checks on the target port.

terraform {
  required_version = ">= 1.3"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.0"
    }
  }
}

resource "aws_lb" "example" {
  name                             = var.name
  load_balancer_type               = "network"
  internal                         = true
  ip_address_type                  = "ipv4"
  subnets                          = var.subnet_ids
  enable_cross_zone_load_balancing = true
}

resource "aws_lb_target_group" "example" {
  name        = var.name
  target_type = "ip" # tgsync supports only IP target groups
  protocol    = "TCP"
  port        = var.target_port
  vpc_id      = var.vpc_id

  # tgsync deregisters a terminating pod at once; the pod should keep serving (preStop
  # sleep) a little longer than this delay.
  deregistration_delay = 30

  health_check {
    protocol            = "TCP"
    interval            = 10
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  tags = {
    "tgsync/cluster"   = var.cluster_name
    "tgsync/namespace" = var.namespace
    "tgsync/selector"  = var.selector
    "tgsync/port"      = coalesce(var.pod_port, tostring(var.target_port))
  }
}

resource "aws_lb_listener" "example" {
  load_balancer_arn = aws_lb.example.arn
  protocol          = "TCP"
  port              = var.listener_port

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.example.arn
  }
}

output "load_balancer_dns_name" {
  value = aws_lb.example.dns_name
}

output "target_group_arn" {
  value = aws_lb_target_group.example.arn
}
