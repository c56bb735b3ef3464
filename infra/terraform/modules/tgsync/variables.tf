# Inputs are checked here as tgsync checks the tags (src/core/binding.rs): a value tgsync
# would report as a binding error fails `terraform plan` instead.

variable "cluster_name" {
  description = "EKS cluster whose pods fill the target group (tag tgsync/cluster); the tgsync stack's ClusterName."
  type        = string

  validation {
    condition     = can(regex("^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$", var.cluster_name))
    error_message = "An EKS cluster name has 1-100 letters, digits, - and _ and starts with a letter or digit."
  }
}

variable "namespace" {
  description = "Namespace of the pods (tag tgsync/namespace)."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", var.namespace))
    error_message = "A namespace is a DNS label: 1-63 lower-case letters, digits and -, starting and ending with a letter or digit."
  }
}

variable "selector" {
  description = "Equality label selector, terms separated by single spaces: \"app.kubernetes.io/name=kafka tier=broker\"; a bare key means \"label exists\" (tag tgsync/selector)."
  type        = string

  validation {
    # Each term: a label key ([prefix/]name), optionally = and a label value (no ==).
    condition = alltrue([
      for term in split(" ", var.selector) :
      can(regex("^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?(=([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?)?$", term))
    ]) && length(var.selector) <= 256
    error_message = "The selector is one or more terms key=value (or a bare key) separated by single spaces; != and set-based selectors are not supported, and AWS tag values allow no commas or parentheses."
  }
}

variable "port" {
  description = "Container port number or name the targets use (tag tgsync/port); null: the target group's port."
  type        = string
  default     = null

  validation {
    condition = var.port == null ? true : (
      can(regex("^[0-9]{1,5}$", var.port)) ? (tonumber(var.port) >= 1 && tonumber(var.port) <= 65535) : can(regex("^[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?$", var.port)) && can(regex("[a-z]", var.port))
    )
    error_message = "The port is a number from 1 to 65535 or a container port name (IANA_SVC_NAME: up to 15 lower-case letters, digits and -, with a letter)."
  }
}

variable "mode" {
  description = "shared (only targets tgsync registered are ever removed) or exclusive (the group is this cluster's alone: any other target is removed; the stack needs AllowExclusive=true)."
  type        = string
  default     = "shared"

  validation {
    condition     = contains(["shared", "exclusive"], var.mode)
    error_message = "The mode is shared or exclusive."
  }
}

# --- the target group --------------------------------------------------------------

variable "name" {
  description = "Name of the target group."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9]([-A-Za-z0-9]{0,30}[A-Za-z0-9])?$", var.name))
    error_message = "A target group name has 1-32 letters, digits and -, and neither starts nor ends with -."
  }
}

variable "vpc_id" {
  description = "VPC of the load balancer (the pods' VPC, or one peered with it)."
  type        = string
}

variable "protocol" {
  description = "Target group protocol: TCP, UDP, TCP_UDP or TLS for an NLB; HTTP or HTTPS for an ALB."
  type        = string
  default     = "TCP"

  validation {
    condition     = contains(["TCP", "UDP", "TCP_UDP", "TLS", "HTTP", "HTTPS"], var.protocol)
    error_message = "The protocol is one of TCP, UDP, TCP_UDP, TLS, HTTP, HTTPS."
  }
}

variable "target_port" {
  description = "The target group's port: the targets' port unless tgsync/port names another."
  type        = number

  validation {
    condition     = var.target_port >= 1 && var.target_port <= 65535 && floor(var.target_port) == var.target_port
    error_message = "The target port is a whole number from 1 to 65535."
  }
}

variable "deregistration_delay" {
  description = "Seconds the load balancer drains a deregistered target; keep the pods' preStop sleep a little longer (docs/operations.md, Graceful termination)."
  type        = number
  default     = 30

  validation {
    condition     = var.deregistration_delay >= 0 && var.deregistration_delay <= 3600 && floor(var.deregistration_delay) == var.deregistration_delay
    error_message = "The deregistration delay is a whole number of seconds from 0 to 3600 (what ELBv2 accepts)."
  }
}

variable "connection_termination" {
  description = "NLB: reset connections still open when the deregistration delay ends (long-lived sockets)."
  type        = bool
  default     = false
}

variable "health_check_path" {
  description = "HTTP(S) health check path (ALB target groups, or NLB HTTP health checks); null: a TCP health check for NLB protocols."
  type        = string
  default     = null
}

variable "tags" {
  description = "Further tags of the target group (tgsync/* keys are set by this module)."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k in keys(var.tags) : substr(k, 0, 7) != "tgsync/"])
    error_message = "tgsync/* tags come from cluster_name, namespace, selector, port and mode."
  }
}

# --- the security group rule from the load balancer to the pods -------------------

variable "pods_security_group_id" {
  description = "Security group of the pods (the node or cluster security group, or the pods' own with security groups for pods); null: add no rule."
  type        = string
  default     = null
}

variable "load_balancer_security_group_id" {
  description = "Security group of the load balancer, admitted to the pods on the pod port. Set this or source_cidr_blocks (an NLB without security groups)."
  type        = string
  default     = null
}

variable "source_cidr_blocks" {
  description = "CIDR blocks admitted to the pods on the pod port when the load balancer has no security group (an NLB's subnets, or the clients' ranges when it preserves client IPs)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.source_cidr_blocks : can(cidrhost(c, 0))])
    error_message = "Each source is an IPv4 or IPv6 CIDR block."
  }
}

variable "pod_port_number" {
  description = "The port the pods listen on, for the security group rule; null: port when it is a number, else target_port."
  type        = number
  default     = null
}

# --- the tgsync stack ---------------------------------------------------------------

variable "stack" {
  description = <<-EOT
    Deploy the tgsync stack for this cluster (once per cluster: leave null in the module
    blocks of the cluster's other target groups). Either from the Serverless Application
    Repository (application_id, semantic_version) or from a packaged template in S3
    (template_url: `sam package` of dist/template.yaml). parameters: template.yaml's
    parameters beside ClusterName (docs/configuration.md, Parameters).
  EOT
  type = object({
    name             = optional(string, "tgsync")
    application_id   = optional(string)
    semantic_version = optional(string)
    template_url     = optional(string)
    parameters       = optional(map(string), {})
  })
  default = null

  validation {
    condition = var.stack == null ? true : (
      (try(var.stack.application_id, null) != null) != (try(var.stack.template_url, null) != null)
    )
    error_message = "Give the stack either application_id (with semantic_version) or template_url, not both."
  }

  validation {
    condition     = var.stack == null ? true : !contains(keys(try(var.stack.parameters, {})), "ClusterName")
    error_message = "ClusterName comes from cluster_name."
  }
}
