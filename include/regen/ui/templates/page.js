const api = (path) => new URL(path, document.baseURI);
document.querySelectorAll('button.trigger').forEach((button) => button.addEventListener('click', () => {
  const dialog = document.getElementById('trigger-dialog');
  dialog.querySelector('pre').textContent = JSON.stringify(JSON.parse(button.dataset.conf), null, 1);
  dialog.querySelector('.dataset').textContent = button.dataset.dataset;
  dialog.querySelector('.outcome').textContent = '';
  dialog.showModal();
}));
document.getElementById('trigger-copy').addEventListener('click', async () => {
  const conf = document.querySelector('#trigger-dialog pre').textContent;
  try { await navigator.clipboard.writeText(conf); } catch (e) { /* the JSON stays on screen to copy by hand */ }
  window.open(new URL('__AIRFLOW__dags/__DAG__', document.baseURI), '_top');
});
document.getElementById('trigger-now').addEventListener('click', async () => {
  const dialog = document.getElementById('trigger-dialog');
  const conf = JSON.parse(dialog.querySelector('pre').textContent);
  // Airflow's own REST API, with the signed-in user's session: Airflow checks that this user may trigger the DAG.
  const answer = await fetch(api('__AIRFLOW__api/v2/dags/__DAG__/dagRuns'), {method: 'POST', credentials: 'same-origin',
    headers: {'Content-Type': 'application/json'}, body: JSON.stringify({logical_date: null, conf})});
  const body = await answer.json().catch(() => ({}));
  const outcome = dialog.querySelector('.outcome');
  if (answer.ok) {
    outcome.innerHTML = '';
    const link = Object.assign(document.createElement('a'), {target: '_top', textContent: body.dag_run_id,
      href: api('__AIRFLOW__dags/__DAG__/runs/' + encodeURIComponent(body.dag_run_id))});
    outcome.append('Triggered ', link);
  } else {
    outcome.textContent = 'Refused (' + answer.status + '): ' + JSON.stringify(body.detail ?? body);
  }
});
document.getElementById('fleet-check').addEventListener('click', async () => {
  const table = document.getElementById('fleet-table');
  table.textContent = 'asking...';
  const fleet = await (await fetch(api('api/fleet'), {credentials: 'same-origin'})).json();
  const cells = (values, tag) => values.map((v) => { const c = document.createElement(tag);
    c.textContent = v ?? '-'; return c; });
  const head = document.createElement('tr');
  const names = ['endpoint', 'health', 'model', 'version', 'context length', 'running', 'slots', 'error'];
  head.append(...cells(names, 'th'));
  table.replaceChildren(head);
  for (const e of fleet) {
    const row = document.createElement('tr');
    row.append(...cells([e.url, e.health, e.model, e.version, e.context_length, e.running_requests,
      e.max_running_requests, e.error], 'td'));
    table.append(row);
  }
});
