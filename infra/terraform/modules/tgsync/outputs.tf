output "target_group_arn" {
  description = "The target group (forward a listener to it)."
  value       = aws_lb_target_group.this.arn
}

output "binding_tags" {
  description = "The tgsync/* tags the target group carries."
  value       = local.binding_tags
}

output "stack_outputs" {
  description = "Outputs of the tgsync stack, when this module deployed it (ResyncRoleArn, StateTableName, ...); empty otherwise."
  value = merge(
    try(aws_serverlessapplicationrepository_cloudformation_stack.tgsync[0].outputs, {}),
    try(aws_cloudformation_stack.tgsync[0].outputs, {}),
  )
}
