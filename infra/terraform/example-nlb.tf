# tgsync example (Terraform): an internal NLB and a TCP listener forwarding to an IP
# target group made by the tgsync module (modules/tgsync), which tags it for tgsync,
# admits the NLB to the pods, and deploys the tgsync stack for the cluster. The same NLB
# as infra/example-nlb.yaml. tgsync keeps the group's targets equal to the ready pods
# matching namespace + selector.

terraform {
  required_version = ">= 1.3"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0, < 7.0"
    }
  }
}

resource "aws_security_group" "nlb" {
  name_prefix = "${var.name}-nlb-"
  description = "NLB ${var.name}"
  vpc_id      = var.vpc_id
}

resource "aws_lb" "example" {
  name                             = var.name
  load_balancer_type               = "network"
  internal                         = true
  ip_address_type                  = "ipv4"
  subnets                          = var.subnet_ids
  security_groups                  = [aws_security_group.nlb.id]
  enable_cross_zone_load_balancing = true
}

module "tgsync_web" {
  source = "./modules/tgsync"

  cluster_name = var.cluster_name
  namespace    = var.namespace
  selector     = var.selector
  port         = var.pod_port

  name        = var.name
  vpc_id      = var.vpc_id
  target_port = var.target_port

  pods_security_group_id          = var.pods_security_group_id
  load_balancer_security_group_id = aws_security_group.nlb.id
  pod_port_number                 = var.pod_port_number

  # Once per cluster: the module blocks of the cluster's other target groups leave
  # `stack` out.
  stack = var.stack
}

resource "aws_lb_listener" "example" {
  load_balancer_arn = aws_lb.example.arn
  protocol          = "TCP"
  port              = var.listener_port

  default_action {
    type             = "forward"
    target_group_arn = module.tgsync_web.target_group_arn
  }
}

# The NLB may send to the pods (the module's rule admits it there).
resource "aws_vpc_security_group_egress_rule" "nlb_to_pods" {
  count = var.pods_security_group_id == null ? 0 : 1

  security_group_id            = aws_security_group.nlb.id
  referenced_security_group_id = var.pods_security_group_id
  ip_protocol                  = "tcp"
  from_port                    = coalesce(var.pod_port_number, var.target_port)
  to_port                      = coalesce(var.pod_port_number, var.target_port)
}

resource "aws_vpc_security_group_ingress_rule" "clients" {
  security_group_id = aws_security_group.nlb.id
  cidr_ipv4         = var.client_cidr
  ip_protocol       = "tcp"
  from_port         = var.listener_port
  to_port           = var.listener_port
}

output "load_balancer_dns_name" {
  value = aws_lb.example.dns_name
}

output "target_group_arn" {
  value = module.tgsync_web.target_group_arn
}

output "tgsync_stack_outputs" {
  value = module.tgsync_web.stack_outputs
}
