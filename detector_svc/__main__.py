from detector_svc.server import main

main()
