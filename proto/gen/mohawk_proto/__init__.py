"""Python code generated from the .proto sources under proto/ (`make proto`); do not edit by hand."""
