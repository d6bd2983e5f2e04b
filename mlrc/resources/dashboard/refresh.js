(function () {
  var seconds = $seconds, box = document.getElementById("pause");
  box.checked = sessionStorage.getItem("mlrc-paused") === "1";
  box.addEventListener("change", function () {
    sessionStorage.setItem("mlrc-paused", box.checked ? "1" : "0");
  });
  setInterval(function () { if (!box.checked) { location.reload(); } }, seconds * 1000);
})();
