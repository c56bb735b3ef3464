terraform {
  required_version = ">= 1.3"
  required_providers {
    # Provider 5 or 6: nothing here uses an argument the version 6 upgrade guide removes
    # or renames (aws_lb_target_group, aws_vpc_security_group_ingress_rule,
    # aws_cloudformation_stack, aws_serverlessapplicationrepository_cloudformation_stack).
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0, < 7.0"
    }
  }
}
