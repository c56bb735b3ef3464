variable "cluster_name" {
  description = "EKS cluster whose pods fill the target group (tag tgsync/cluster); the tgsync stack's ClusterName."
  type        = string

  validation {
    condition     = can(regex("^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$", var.cluster_name))
    error_message = "An EKS cluster name has 1-100 letters, digits, - and _."
  }
}

variable "vpc_id" {
  description = "VPC of the cluster."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets for the NLB (one per Availability Zone)."
  type        = list(string)
}

variable "name" {
  description = "Name of the load balancer and target group."
  type        = string
  default     = "web"
}

variable "namespace" {
  description = "Namespace of the pods (tag tgsync/namespace)."
  type        = string
  default     = "shop"
}

variable "selector" {
  description = "Equality label selector, terms separated by spaces, e.g. \"app.kubernetes.io/name=kafka tier=broker\" (tag tgsync/selector)."
  type        = string
  default     = "app=web"
}

variable "listener_port" {
  type    = number
  default = 80
}

variable "target_port" {
  description = "The target group's port; the default port of its targets."
  type        = number
  default     = 8080
}

variable "pod_port" {
  description = "Container port number or name the targets use (tag tgsync/port); null to use target_port."
  type        = string
  default     = "http"
}

variable "pods_security_group_id" {
  description = "Security group of the pods (e.g. the cluster security group); null: add no rule."
  type        = string
  default     = null
}

variable "pod_port_number" {
  description = "Port the pods listen on, when pod_port is a name (for the security group rules); null: target_port."
  type        = number
  default     = null
}

variable "client_cidr" {
  description = "Clients admitted to the NLB's listener."
  type        = string
  default     = "10.0.0.0/8"
}

variable "stack" {
  description = "The tgsync stack to deploy for the cluster (see modules/tgsync, variable stack); null: deployed otherwise."
  type = object({
    name             = optional(string, "tgsync")
    application_id   = optional(string)
    semantic_version = optional(string)
    template_url     = optional(string)
    parameters       = optional(map(string), {})
  })
  default = null
}
