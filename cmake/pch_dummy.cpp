// Anchors the shared precompiled header target (cmake/DionTorch.cmake).
