"""Real AWS Lambda: deploying the actor function (lambda_deploy) and reading the REPORT line that
bills an invocation (lambda_report; the local endpoint writes the same line)."""
