from learner_svc.server import main

main()
