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
