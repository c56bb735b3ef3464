# Checks of inputs that involve more than one variable (a variable's own validation can
# name only itself before Terraform 1.9): planned without a provider, so
# scripts/terraform-inputs.sh exercises them with variables.tf.

output "pods_admit" {
  description = "Where the pods' security group rule admits traffic from: the load balancer's security group, the CIDR blocks, or nothing (no pods_security_group_id)."
  value       = var.pods_security_group_id == null ? "nothing" : var.load_balancer_security_group_id != null ? "load balancer security group" : "CIDR blocks"

  precondition {
    condition     = var.pods_security_group_id == null || var.load_balancer_security_group_id != null || length(var.source_cidr_blocks) > 0
    error_message = "With pods_security_group_id, set load_balancer_security_group_id or source_cidr_blocks: with neither, no rule would admit the load balancer's traffic to the pods."
  }
}
